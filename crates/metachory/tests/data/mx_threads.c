/* A guest with three threads, which the migrator must refuse: it prints
 * "ready" once its two workers run, then a counter every 10 ms (COUNT
 * lines, default 6000), and exits 0. */
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <time.h>
#include <unistd.h>

static void *work(void *arg) {
    (void)arg;
    for (;;) pause();
    return NULL;
}

int main(int argc, char **argv) {
    long count = argc > 1 ? atol(argv[1]) : 6000;
    pthread_t a, b;
    pthread_create(&a, NULL, work, NULL);
    pthread_create(&b, NULL, work, NULL);
    printf("ready\n");
    fflush(stdout);
    for (long i = 0; i < count; i++) {
        printf("%ld\n", i);
        fflush(stdout);
        struct timespec ts = {0, 10 * 1000 * 1000};
        nanosleep(&ts, NULL);
    }
    return 0;
}
