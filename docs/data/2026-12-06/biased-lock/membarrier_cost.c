#include <linux/membarrier.h>
#include <sys/syscall.h>
#include <unistd.h>
#include <stdio.h>
#include <time.h>
#include <pthread.h>
static volatile int stop;
static void *spin(void *a) { while (!stop) {} return 0; }
static double now() { struct timespec t; clock_gettime(CLOCK_MONOTONIC, &t); return t.tv_sec * 1e6 + t.tv_nsec / 1e3; }
int main() {
  if (syscall(SYS_membarrier, MEMBARRIER_CMD_REGISTER_PRIVATE_EXPEDITED, 0, 0)) { perror("register"); return 1; }
  for (int threads = 0; threads <= 1; threads++) {
    pthread_t t; if (threads) pthread_create(&t, 0, spin, 0);
    usleep(10000);
    int n = 20000; double t0 = now();
    for (int i = 0; i < n; i++) syscall(SYS_membarrier, MEMBARRIER_CMD_PRIVATE_EXPEDITED, 0, 0);
    printf("other running threads %d: %.2f us a call\n", threads, (now() - t0) / n);
    if (threads) { stop = 1; pthread_join(t, 0); }
  }
}
