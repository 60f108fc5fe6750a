"""Varied real sentences for the int8 accuracy tests: short, long, numbers, code, non-English,
punctuation; and queries for a retrieval check over them."""

SENTENCES = [
    "A cat sits on the mat.",
    "The cat is sleeping on the rug.",
    "Dogs love to play fetch in the park.",
    "Hi",
    "yes",
    "Thanks!",
    "The stock market fell 3.2% on Tuesday after the central bank raised rates.",
    "Revenue grew from $1.4 billion in 2021 to $2.9 billion in 2023.",
    "Call 555-0199 between 9:00 and 17:30, Monday to Friday.",
    "The recipe needs 250 g of butter, 3 eggs and 400 ml of milk.",
    "Pi is approximately 3.14159265358979.",
    "for i in range(10): print(i * i)",
    "import numpy as np; x = np.zeros((3, 4), dtype=np.float32)",
    "SELECT * FROM users WHERE age > 30 ORDER BY name;",
    "git commit -m 'fix the off-by-one error in the parser'",
    '<div class="header"><a href="/home">Home</a></div>',
    '{"id": 17, "name": "widget", "tags": ["blue", "small"]}',
    "Le chat dort sur le canapé depuis ce matin.",
    "Ich habe gestern ein neues Fahrrad gekauft.",
    "El tren sale de la estación a las ocho de la mañana.",
    "Il mio ristorante preferito è vicino al fiume.",
    "Eu gosto de ler livros antes de dormir.",
    "Москва — столица России.",
    "我喜欢在周末去公园散步。",
    "今日はとても暑いですね。",
    "서울은 한국의 수도입니다.",
    "مرحبا، كيف حالك اليوم؟",
    "What?!",
    "Wait... really??? No way!!!",
    "-- -- -- ;;; ::: !!! ???",
    "(see footnote 3) [citation needed] {draft}",
    "The mitochondria is the powerhouse of the cell.",
    "Quantum entanglement links the states of two particles regardless of distance.",
    "The defendant pleaded not guilty to all charges in federal court.",
    "Climate change is raising sea levels and intensifying storms around the world.",
    "The new smartphone has a 6.7-inch display and a 5,000 mAh battery.",
    "She won the marathon in two hours, eleven minutes and forty seconds.",
    "Please restart your computer to complete the installation of updates.",
    "The museum's collection includes paintings by Monet, Van Gogh and Cézanne.",
    "How do I convert a string to an integer in Python?",
    "What is the best way to learn a new language as an adult?",
    "Where can I find cheap flights to Lisbon in October?",
    "In the beginning God created the heaven and the earth. And the earth was without form, "
    "and void; and darkness was upon the face of the deep. And the Spirit of God moved upon "
    "the face of the waters. And God said, Let there be light: and there was light.",
    "The Transformer architecture replaces recurrence with self-attention, allowing every "
    "position of a sequence to attend to every other position in a single step; stacked "
    "layers of attention and feed-forward networks, with residual connections and layer "
    "normalisation, form the encoder, and the same pattern with masked attention forms the "
    "decoder. Because the computation is parallel over positions, training on modern "
    "accelerators is far faster than with recurrent networks, which process one token at a "
    "time. The cost is quadratic in the sequence length, which motivated many efficient "
    "variants: sparse patterns, low-rank projections, kernel approximations and, more "
    "recently, exact attention kernels that avoid materialising the score matrix at all.",
    "Terms of service: by using this website you agree to the collection of cookies, the "
    "processing of personal data under the applicable regulations, and the resolution of "
    "disputes by arbitration in the jurisdiction stated in section 12, except where local "
    "law forbids it; these terms may change at any time without notice.",
    "ALL CAPS HEADLINE: LOCAL TEAM WINS CHAMPIONSHIP",
    "the quick brown fox jumps over the lazy dog",
    "email me at jane.doe@example.org or visit https://example.org/about",
    "🙂 great job 🎉🎉",
    "The meeting has been moved to 3 p.m. on Thursday, 14 March.",
    'Error: Traceback (most recent call last): File "main.py", line 3, in <module>',
    "Vitamin D deficiency is common in northern countries during winter.",
    "Bananas are berries, but strawberries are not.",
]

# Queries for the retrieval check: each has one or more related sentences above.
QUERIES = [
    "a kitten resting on a carpet",
    "share prices dropped after an interest rate hike",
    "company income doubled",
    "loop printing squares in Python",
    "database query for older users",
    "a French sentence about a sleeping cat",
    "buying a bicycle",
    "the capital of Russia",
    "the biology of cells and energy",
    "rising oceans and global warming",
    "phone with a large screen and battery",
    "running race result",
    "software update requires reboot",
    "impressionist paintings in a gallery",
    "parse text as a number in python",
    "learning foreign languages",
    "cheap air travel to Portugal",
    "self-attention neural network architecture",
    "website legal agreement and privacy",
    "sports championship victory",
    "contact address and website",
    "rescheduled appointment",
    "python exception stack trace",
    "sunlight vitamin in winter",
    "fruit classification trivia",
    "creation story in the Bible",
]
