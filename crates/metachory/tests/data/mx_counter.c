/* A guest that keeps state, for Metachory's migration tests: it fills a
 * heap buffer of MB megabytes with a pseudo-random pattern and prints its
 * checksum, then prints a counter every 10 ms (COUNT lines), keeping a
 * floating-point sum in registers and on its stack, and at the end prints
 * the checksum again and the sum. It exits 7 when the memory is intact. */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <time.h>

static uint64_t checksum(const unsigned char *b, size_t n) {
    uint64_t h = 1469598103934665603ULL;
    for (size_t i = 0; i < n; i++) h = (h ^ b[i]) * 1099511628211ULL;
    return h;
}

int main(int argc, char **argv) {
    long mb = argc > 1 ? atol(argv[1]) : 4;
    long count = argc > 2 ? atol(argv[2]) : 300;
    long ms = argc > 3 ? atol(argv[3]) : 10;
    size_t n = (size_t)mb << 20;
    unsigned char *buf = malloc(n);
    if (!buf) return 2;
    uint64_t seed = 0x9e3779b97f4a7c15ULL;
    for (size_t i = 0; i < n; i++) {
        seed = seed * 6364136223846793005ULL + 1442695040888963407ULL;
        buf[i] = (unsigned char)(seed >> 56);
    }
    uint64_t before = checksum(buf, n);
    printf("checksum %016llx\n", (unsigned long long)before);
    fflush(stdout);
    volatile double acc = 0;
    for (long i = 0; i < count; i++) {
        printf("%ld\n", i);
        fflush(stdout);
        acc += 0.5;
        struct timespec ts = {0, ms * 1000 * 1000};
        nanosleep(&ts, NULL);
    }
    uint64_t after = checksum(buf, n);
    printf("checksum %016llx\n", (unsigned long long)after);
    printf("sum %.1f\n", acc);
    fflush(stdout);
    return before == after ? 7 : 3;
}
