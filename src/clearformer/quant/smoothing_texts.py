"""Texts for int8 smoothing: a few varied sentences whose activations set the
per-channel smoothing factors (their maxima, not their meaning, matter).

They are deliberately unlike the sentences the tests measure accuracy on, so that the tests do
not grade the calibration on its own data.
"""

from __future__ import annotations

SMOOTHING_TEXTS: tuple[str, ...] = (
    "The committee postponed its decision until the spring meeting.",
    "How do I reset the password on my router?",
    "Photosynthesis converts light energy into chemical energy stored in glucose.",
    "She bought three apples, two pears and a loaf of bread for 4.75 euros.",
    "ERROR 503: service unavailable, retry after 30 seconds",
    "def mean(xs): return sum(xs) / len(xs)",
    "SELECT name, COUNT(*) FROM orders GROUP BY name HAVING COUNT(*) > 10;",
    "Le musée ouvre à neuf heures et ferme à dix-huit heures.",
    "Der Zug nach München hat zwanzig Minuten Verspätung.",
    "東京は日本の首都です。",
    "¿Dónde está la estación de autobuses más cercana?",
    "Wow!!! That was... unexpected?!",
    "ok",
    "The patient presented with fever, cough and shortness of breath for five days, and the "
    "chest radiograph showed bilateral infiltrates consistent with viral pneumonia; she was "
    "admitted for oxygen therapy and observation.",
    "In 1969, Apollo 11 landed on the Moon, and Neil Armstrong stepped onto its surface.",
    "Interest rates rose by 0.25 percentage points, the third increase this year.",
    "https://example.com/api/v2/items?id=42&sort=desc",
    "A quiet lake reflects the mountains at dawn.",
    "Terms and conditions apply; see section 4(b) for details on refunds and cancellations.",
    "The function raises a ValueError when the input list is empty.",
    "Привет, как у тебя дела?",
    "Machine learning models can overfit small datasets without regularisation.",
    "Add two cups of flour, a pinch of salt, and stir until smooth.",
    "The quarterback threw for 312 yards and three touchdowns in the second half.",
)
