/* The float32 FMA peak of one core: what no matrix product can beat.
 *
 * Twelve independent 512-bit fused multiply-adds per iteration, all in registers (no memory
 * traffic, no dependency stalls), timed three times. A core with two 256-bit FMA units does
 * 32 float32 FLOPs per cycle, one with two 512-bit units 64 (Zen 4 has the former and runs
 * each 512-bit FMA as two halves). docs/performance.md compares the result with the GEMM rate
 * behind encode's float32 bound (two threads: compare with twice this figure).
 *
 * Build and run (gcc or clang, an AVX-512 CPU):
 *   gcc -O2 -mavx512f -mfma benchmarks/fma_peak.c -o /tmp/fma_peak && /tmp/fma_peak
 */
#include <immintrin.h>
#include <stdio.h>
#include <time.h>

#define CHAINS 12

int main(void) {
    __m512 acc[CHAINS];
    const __m512 scale = _mm512_set1_ps(1.0000001f), shift = _mm512_set1_ps(1e-7f);
    for (int i = 0; i < CHAINS; i++) acc[i] = _mm512_set1_ps((float)i);
    const long iterations = 200000000;
    for (int round = 0; round < 3; round++) {
        struct timespec start, end;
        clock_gettime(CLOCK_MONOTONIC, &start);
        for (long n = 0; n < iterations; n++) {
#pragma GCC unroll 12
            for (int i = 0; i < CHAINS; i++) acc[i] = _mm512_fmadd_ps(acc[i], scale, shift);
        }
        clock_gettime(CLOCK_MONOTONIC, &end);
        double seconds = (end.tv_sec - start.tv_sec) + 1e-9 * (end.tv_nsec - start.tv_nsec);
        float sum = 0;  /* used, so that the loop is not optimised away */
        for (int i = 0; i < CHAINS; i++) sum += _mm512_reduce_add_ps(acc[i]);
        /* 16 lanes x 2 FLOPs per FMA */
        printf("%.1f GFLOP/s float32 FMA on one core (checksum %g)\n",
               iterations * CHAINS * 32.0 / seconds / 1e9, sum);
    }
    return 0;
}
