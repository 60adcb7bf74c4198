// pingpong.c - small-message latency floor between two processes on this machine.
// Build: gcc -O2 -o pingpong pingpong.c
// Usage: pingpong [iters] [reps] [mode]   (mode: run only that one, e.g. shm_spin as a cheap probe of
//        where the host put the two vCPUs: ~0.05 us one-way vs ~0.25 us; see bench/log/anchors-2026-11-22.md)
// Modes (one-way latency = round trip / 2, median over reps):
//   shm_spin   : shared-memory flag, both sides busy-spin (what MPI vader / UCX sm do)
//   pipe_block : blocking 1-byte pipe ping-pong (includes sleep + wake-up of the peer)
//   tcp_block  : blocking 8-byte TCP ping-pong on 127.0.0.1, TCP_NODELAY
//   tcp_spin   : non-blocking 8-byte TCP ping-pong on 127.0.0.1, recv(MSG_DONTWAIT) spin
//   shm_gather : not a ping-pong: the floor of a 2-rank 4 KiB gather staged through shared memory, per call.
//                The sender copies its block into the next of 64 cells and stamps it, running ahead while
//                cells are free; the root waits for the stamp, copies the cell and its own block out, frees
//                the cell (what MPI's eager sends and tandem's staged path do, with no other work).
#define _GNU_SOURCE
#include <arpa/inet.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

static double now(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return ts.tv_sec + ts.tv_nsec * 1e-9;
}
static int cmpd(const void* a, const void* b) {
  double x = *(const double*)a, y = *(const double*)b;
  return (x > y) - (x < y);
}

static double shm_spin(int iters) {
  _Atomic long* f = mmap(0, 4096, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_ANONYMOUS, -1, 0);
  atomic_store(&f[0], 0);
  atomic_store(&f[8], 0);
  pid_t p = fork();
  if (p == 0) {
    for (long i = 1; i <= iters; i++) {
      while (atomic_load_explicit(&f[0], memory_order_acquire) != i) __builtin_ia32_pause();
      atomic_store_explicit(&f[8], i, memory_order_release);
    }
    _exit(0);
  }
  double t0 = now();
  for (long i = 1; i <= iters; i++) {
    atomic_store_explicit(&f[0], i, memory_order_release);
    while (atomic_load_explicit(&f[8], memory_order_acquire) != i) __builtin_ia32_pause();
  }
  double dt = now() - t0;
  waitpid(p, 0, 0);
  munmap((void*)f, 4096);
  return dt / iters / 2;
}

enum { kCells = 64, kBlock = 4096 };
struct gather_cells {
  _Atomic long freed;  // cells the root has emptied
  char pad[56];
  struct {
    _Atomic long stamp;
    char pad[56];
    char data[kBlock];
  } cell[kCells];
};

static double shm_gather(int iters) {
  struct gather_cells* g = mmap(0, sizeof *g, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_ANONYMOUS, -1, 0);
  memset(g, 0, sizeof *g);
  pid_t p = fork();
  if (p == 0) {
    char* block = malloc(kBlock);
    memset(block, 1, kBlock);
    for (long i = 0; i < iters; i++) {
      while (i - atomic_load_explicit(&g->freed, memory_order_acquire) >= kCells) __builtin_ia32_pause();
      memcpy(g->cell[i % kCells].data, block, kBlock);
      atomic_store_explicit(&g->cell[i % kCells].stamp, i + 1, memory_order_release);
    }
    _exit(0);
  }
  char *own = malloc(kBlock), *out = malloc(2 * kBlock);
  memset(own, 2, kBlock);
  double t0 = now();
  for (long i = 0; i < iters; i++) {
    while (atomic_load_explicit(&g->cell[i % kCells].stamp, memory_order_acquire) != i + 1) __builtin_ia32_pause();
    memcpy(out + kBlock, g->cell[i % kCells].data, kBlock);
    memcpy(out, own, kBlock);
    atomic_store_explicit(&g->freed, i + 1, memory_order_release);
  }
  double dt = now() - t0;
  waitpid(p, 0, 0);
  const int right = out[0] == 2 && out[kBlock] == 1;
  free(own);
  free(out);
  munmap(g, sizeof *g);
  return right ? dt / iters : -1;
}

static double pipe_block(int iters) {
  int a[2], b[2];
  if (pipe(a) || pipe(b)) return -1;
  char c = 0;
  pid_t p = fork();
  if (p == 0) {
    for (int i = 0; i < iters; i++) {
      if (read(a[0], &c, 1) != 1 || write(b[1], &c, 1) != 1) _exit(1);
    }
    _exit(0);
  }
  double t0 = now();
  for (int i = 0; i < iters; i++) {
    if (write(a[1], &c, 1) != 1 || read(b[0], &c, 1) != 1) return -1;
  }
  double dt = now() - t0;
  waitpid(p, 0, 0);
  close(a[0]);
  close(a[1]);
  close(b[0]);
  close(b[1]);
  return dt / iters / 2;
}

static int recv_all(int fd, char* buf, int n, int spin) {
  int got = 0;
  while (got < n) {
    ssize_t r = recv(fd, buf + got, n - got, spin ? MSG_DONTWAIT : 0);
    if (r > 0)
      got += r;
    else if (r == 0)
      return -1;
  }
  return 0;
}

static double tcp_pp(int iters, int spin) {
  int ls = socket(AF_INET, SOCK_STREAM, 0), one = 1;
  struct sockaddr_in sa = {.sin_family = AF_INET, .sin_port = 0};
  sa.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  setsockopt(ls, SOL_SOCKET, SO_REUSEADDR, &one, sizeof one);
  if (bind(ls, (void*)&sa, sizeof sa) || listen(ls, 1)) return -1;
  socklen_t sl = sizeof sa;
  getsockname(ls, (void*)&sa, &sl);
  pid_t p = fork();
  char buf[8] = {0};
  if (p == 0) {
    int s = socket(AF_INET, SOCK_STREAM, 0);
    if (connect(s, (void*)&sa, sizeof sa)) _exit(1);
    setsockopt(s, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
    for (int i = 0; i < iters; i++) {
      if (recv_all(s, buf, 8, spin) || send(s, buf, 8, 0) != 8) _exit(1);
    }
    close(s);
    _exit(0);
  }
  int s = accept(ls, 0, 0);
  setsockopt(s, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
  double t0 = now();
  for (int i = 0; i < iters; i++) {
    if (send(s, buf, 8, 0) != 8 || recv_all(s, buf, 8, spin)) return -1;
  }
  double dt = now() - t0;
  waitpid(p, 0, 0);
  close(s);
  close(ls);
  return dt / iters / 2;
}

int main(int argc, char** argv) {
  int iters = argc > 1 ? atoi(argv[1]) : 20000;
  int reps = argc > 2 ? atoi(argv[2]) : 5;
  const char* names[] = {"shm_spin", "pipe_block", "tcp_block", "tcp_spin", "shm_gather"};
  printf("# mode,iters,reps,oneway_median_us,oneway_min_us,oneway_max_us (shm_gather: per call)\n");
  for (int m = 0; m < 5; m++) {
    if (argc > 3 && strcmp(argv[3], names[m]) != 0) continue;
    double* t = calloc(reps, sizeof(double));
    for (int r = 0; r < reps; r++) {
      switch (m) {
        case 0: t[r] = shm_spin(iters * 5); break;
        case 1: t[r] = pipe_block(iters); break;
        case 2: t[r] = tcp_pp(iters, 0); break;
        case 3: t[r] = tcp_pp(iters, 1); break;
        case 4: t[r] = shm_gather(iters * 5); break;
      }
    }
    qsort(t, reps, sizeof(double), cmpd);
    printf("%s,%d,%d,%.3f,%.3f,%.3f\n", names[m], m == 0 || m == 4 ? iters * 5 : iters, reps, t[reps / 2] * 1e6,
           t[0] * 1e6, t[reps - 1] * 1e6);
    fflush(stdout);
    free(t);
  }
  return 0;
}
