/* A guest with three threads, which the migrator must refuse: it prints
 * "ready" once its two workers run, then sleeps. */
#include <pthread.h>
#include <stdio.h>
#include <unistd.h>

static void *work(void *arg) {
    (void)arg;
    for (;;) pause();
    return NULL;
}

int main(void) {
    pthread_t a, b;
    pthread_create(&a, NULL, work, NULL);
    pthread_create(&b, NULL, work, NULL);
    printf("ready\n");
    fflush(stdout);
    sleep(60);
    return 0;
}
