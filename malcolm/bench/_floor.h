/* Hardware floors for `malcolm bench runtime`, in plain C with pthreads: what the transport
   itself allows, measured in the same run as the malcolm figures they are compared with.

   - fl_udp_pingpong: a 64-byte UDP ping-pong on loopback, both sides busy-polling;
   - fl_shm_pingpong: the same over two shared-memory message rings (the shm transport's ring);
   - fl_udp_reflect / fl_shm_reflect: a reflector thread answers every message it receives
     (batched, recvmmsg/sendmmsg or ring peek/push), flooded by the calling thread; reports
     messages per second of the reflector's own CPU time: the per-core ceiling of a gateway,
     which does at least this much work per task. */
#ifndef MALCOLM_FLOOR_H
#define MALCOLM_FLOOR_H
#ifndef _GNU_SOURCE
#define _GNU_SOURCE 1
#endif
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <errno.h>
#include <unistd.h>
#include <pthread.h>
#include <sys/socket.h>
#include <netinet/in.h>
#include <arpa/inet.h>
#include <poll.h>
#define FL_SPIN_NS 50000
#include "net/_netc.h"

static inline int64_t fl_now(void) {
  struct timespec ts; clock_gettime(CLOCK_MONOTONIC, &ts);
  return (int64_t)ts.tv_sec * 1000000000ll + ts.tv_nsec;
}
static inline int64_t fl_cpu(void) {
  struct timespec ts; clock_gettime(CLOCK_THREAD_CPUTIME_ID, &ts);
  return (int64_t)ts.tv_sec * 1000000000ll + ts.tv_nsec;
}
static inline void fl_relax(void) {
#if defined(__x86_64__) || defined(__i386__)
  __builtin_ia32_pause();
#endif
}

static int fl_udp_socket(struct sockaddr_in *addr) {
  int fd = socket(AF_INET, SOCK_DGRAM, 0);
  if (fd < 0) return -errno;
  int buf = 4 << 20;
  setsockopt(fd, SOL_SOCKET, SO_RCVBUF, &buf, sizeof(buf));
  setsockopt(fd, SOL_SOCKET, SO_SNDBUF, &buf, sizeof(buf));
  memset(addr, 0, sizeof(*addr));
  addr->sin_family = AF_INET;
  addr->sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  if (bind(fd, (struct sockaddr *)addr, sizeof(*addr)) < 0) { int e = errno; close(fd); return -e; }
  socklen_t sl = sizeof(*addr);
  getsockname(fd, (struct sockaddr *)addr, &sl);
  return fd;
}

/* ------------------------------------------------------------ ping-pong */
typedef struct { int fd; volatile int stop; mc_ring_hdr *in, *out; int block; } fl_pong;

static void *fl_udp_pong_main(void *arg) {
  fl_pong *p = (fl_pong *)arg;
  uint8_t buf[256]; struct sockaddr_in src; socklen_t sl;
  while (!p->stop) {
    sl = sizeof(src);
    ssize_t r = recvfrom(p->fd, buf, sizeof(buf), p->block ? 0 : MSG_DONTWAIT,
                         (struct sockaddr *)&src, &sl);
    if (r <= 0) { fl_relax(); continue; }
    if (r == 1) break;
    sendto(p->fd, buf, (size_t)r, 0, (struct sockaddr *)&src, sl);
  }
  return NULL;
}

/* Up to n round trips of `size`-byte datagrams, for at most max_s seconds; rtt[i] in ns.
   The pinging side busy-polls; the answering side too, or (block) it blocks in recv, like a
   client busy-polling a server that sleeps when idle. Returns the number done, or -errno. */
static int fl_udp_pingpong(int n, int size, int64_t *rtt, double max_s, int block) {
  struct sockaddr_in a, b; uint8_t buf[256];
  if (size < 2 || size > 256) return -EINVAL;
  int fa = fl_udp_socket(&a); if (fa < 0) return fa;
  int fb = fl_udp_socket(&b); if (fb < 0) { close(fa); return fb; }
  fl_pong p = {fb, 0, NULL, NULL, block};
  pthread_t th;
  if (pthread_create(&th, NULL, fl_udp_pong_main, &p)) { close(fa); close(fb); return -EAGAIN; }
  memset(buf, 7, sizeof(buf));
  int64_t deadline = fl_now() + (int64_t)(max_s * 1e9);
  int done = 0;
  for (int i = 0; i < n; i++) {
    int64_t t0 = fl_now();
    if (t0 > deadline) break;
    sendto(fa, buf, (size_t)size, 0, (struct sockaddr *)&b, sizeof(b));
    int64_t spins = 0;
    while (recv(fa, buf, sizeof(buf), MSG_DONTWAIT) <= 0) {   /* the client always spins */
      fl_relax();
      if (++spins > 200000000) { rtt[i] = -1; break; }
    }
    rtt[i] = fl_now() - t0;
    done++;
  }
  p.stop = 1;
  sendto(fa, buf, 1, 0, (struct sockaddr *)&b, sizeof(b));
  pthread_join(th, NULL);
  close(fa); close(fb);
  return done;
}

static mc_ring_hdr *fl_ring_new(uint32_t cap, uint32_t cell) {
  mc_ring_hdr *r = (mc_ring_hdr *)aligned_alloc(64, (mc_ring_bytes(cap, cell) + 63) & ~(size_t)63);
  if (r) mc_ring_init(r, cap, cell, (int32_t)getpid(), 0, 0);
  return r;
}

/* Wait for a message on ring r: spin, or (block) sleep on its doorbell like the shm
   transport does. NULL only when *stop is set. */
static mc_cell_hdr *fl_ring_wait(mc_ring_hdr *r, int block, volatile int *stop) {
  mc_cell_hdr *c;
  while (!(c = mc_ring_peek(r, 0))) {
    if (stop && *stop) return NULL;
    if (!block) { fl_relax(); continue; }
    uint32_t t = mc_bell_prepare(&r->bell);
    if (!mc_ring_empty(r) || (stop && *stop)) { mc_bell_cancel(&r->bell); continue; }
    mc_bell_wait(&r->bell, t, 1000000);
  }
  return c;
}

static void *fl_shm_pong_main(void *arg) {
  fl_pong *p = (fl_pong *)arg;
  while (!p->stop) {
    mc_cell_hdr *c = fl_ring_wait(p->in, p->block, &p->stop);
    if (!c) break;
    while (mc_ring_push(p->out, c->src, (const uint8_t *)(c + 1), c->len) != 0) fl_relax();
    mc_bell_ring(&p->out->bell);
    mc_ring_release(p->in, 1);
  }
  return NULL;
}

/* n round trips through two message rings (the shm transport's ring, in one process). */
static int fl_shm_pingpong(int n, int size, int64_t *rtt, double max_s, int block) {
  uint8_t buf[256], src[24] = {0};
  if (size < 2 || size > 256) return -EINVAL;
  mc_ring_hdr *ra = fl_ring_new(64, 64 + 256), *rb = fl_ring_new(64, 64 + 256);
  if (!ra || !rb) { free(ra); free(rb); return -ENOMEM; }
  fl_pong p = {-1, 0, ra, rb, block};
  pthread_t th;
  if (pthread_create(&th, NULL, fl_shm_pong_main, &p)) { free(ra); free(rb); return -EAGAIN; }
  memset(buf, 7, sizeof(buf));
  int64_t deadline = fl_now() + (int64_t)(max_s * 1e9);
  int done = 0;
  for (int i = 0; i < n; i++) {
    int64_t t0 = fl_now();
    if (t0 > deadline) break;
    while (mc_ring_push(ra, src, buf, (uint32_t)size) != 0) fl_relax();
    mc_bell_ring(&ra->bell);
    fl_ring_wait(rb, 0, NULL);                                 /* the client always spins */
    mc_ring_release(rb, 1);
    rtt[i] = fl_now() - t0;
    done++;
  }
  p.stop = 1;
  mc_bell_ring(&ra->bell);
  pthread_join(th, NULL);
  free(ra); free(rb);
  return done;
}

/* ------------------------------------------------------------ reflector throughput */
typedef struct {
  int fd; mc_ring_hdr *in, *out;
  volatile int stop;
  uint64_t count;
  int64_t cpu_ns, wall_ns;
  int64_t busy_ns;            /* passes that moved messages, to the next pass (as the gateway) */
} fl_refl;

static void *fl_udp_refl_main(void *arg) {
  fl_refl *r = (fl_refl *)arg;
  struct mmsghdr m[64]; struct iovec iov[64]; struct sockaddr_in sa[64];
  static __thread uint8_t bufs[64][256];
  int64_t c0 = fl_cpu(), w0 = fl_now(), idle_since = 0, prev = w0;
  int worked = 0;
  while (!r->stop) {
    int64_t t = fl_now();
    if (worked) r->busy_ns += t - prev;
    prev = t;
    worked = 0;
    for (int i = 0; i < 64; i++) {
      iov[i].iov_base = bufs[i]; iov[i].iov_len = 256;
      memset(&m[i].msg_hdr, 0, sizeof(m[i].msg_hdr));
      m[i].msg_hdr.msg_name = &sa[i]; m[i].msg_hdr.msg_namelen = sizeof(sa[i]);
      m[i].msg_hdr.msg_iov = &iov[i]; m[i].msg_hdr.msg_iovlen = 1;
    }
    int n = recvmmsg(r->fd, m, 64, MSG_DONTWAIT, NULL);
    if (n <= 0) {
      /* idle like an adaptive gateway: spin a while, then block */
      if (!idle_since) idle_since = t;
      if (t - idle_since < FL_SPIN_NS) { fl_relax(); continue; }
      struct pollfd pf = {r->fd, POLLIN, 0};
      poll(&pf, 1, 5);
      continue;
    }
    idle_since = 0;
    worked = 1;
    for (int i = 0; i < n; i++) iov[i].iov_len = m[i].msg_len;
    int sent = 0;
    while (sent < n) {
      int k = sendmmsg(r->fd, m + sent, (unsigned)(n - sent), MSG_DONTWAIT);
      if (k <= 0) break;
      sent += k;
    }
    r->count += (uint64_t)n;
  }
  r->cpu_ns = fl_cpu() - c0; r->wall_ns = fl_now() - w0;
  return NULL;
}

/* Flood a UDP reflector with `size`-byte datagrams for `seconds`. Results in *out. */
static int fl_udp_reflect(double seconds, int size, fl_refl *out) {
  struct sockaddr_in a, b;
  int fa = fl_udp_socket(&a); if (fa < 0) return fa;
  int fb = fl_udp_socket(&b); if (fb < 0) { close(fa); return fb; }
  memset(out, 0, sizeof(*out)); out->fd = fb;
  pthread_t th;
  if (pthread_create(&th, NULL, fl_udp_refl_main, out)) { close(fa); close(fb); return -EAGAIN; }
  struct mmsghdr m[64]; struct iovec iov[64]; uint8_t buf[256]; uint8_t rbuf[64][256];
  struct mmsghdr rm[64]; struct iovec riov[64];
  memset(buf, 7, sizeof(buf)); memset(m, 0, sizeof(m)); memset(rm, 0, sizeof(rm));
  for (int i = 0; i < 64; i++) {
    iov[i].iov_base = buf; iov[i].iov_len = (size_t)size;
    m[i].msg_hdr.msg_name = &b; m[i].msg_hdr.msg_namelen = sizeof(b);
    m[i].msg_hdr.msg_iov = &iov[i]; m[i].msg_hdr.msg_iovlen = 1;
    riov[i].iov_base = rbuf[i]; riov[i].iov_len = 256;
    rm[i].msg_hdr.msg_iov = &riov[i]; rm[i].msg_hdr.msg_iovlen = 1;
  }
  int64_t end = fl_now() + (int64_t)(seconds * 1e9);
  while (fl_now() < end) {
    sendmmsg(fa, m, 64, MSG_DONTWAIT);
    while (recvmmsg(fa, rm, 64, MSG_DONTWAIT, NULL) > 0) {}
  }
  out->stop = 1;
  pthread_join(th, NULL);
  close(fa); close(fb);
  return 0;
}

static void *fl_shm_refl_main(void *arg) {
  fl_refl *r = (fl_refl *)arg;
  int64_t c0 = fl_cpu(), w0 = fl_now(), idle_since = 0, prev = w0;
  int worked = 0;
  while (!r->stop) {
    int64_t t = fl_now();
    if (worked) r->busy_ns += t - prev;
    prev = t;
    int n = 0;
    mc_cell_hdr *c;
    while (n < 64 && (c = mc_ring_peek(r->in, (uint64_t)n)) != NULL) {
      mc_ring_push(r->out, c->src, (const uint8_t *)(c + 1), c->len);   /* full: dropped */
      n++;
    }
    worked = n > 0;
    if (!n) {
      if (!idle_since) idle_since = t;
      if (t - idle_since < FL_SPIN_NS) { fl_relax(); continue; }
      struct timespec ts = {0, 20000};
      nanosleep(&ts, NULL);
      continue;
    }
    idle_since = 0;
    mc_ring_release(r->in, (uint64_t)n);
    r->count += (uint64_t)n;
  }
  r->cpu_ns = fl_cpu() - c0; r->wall_ns = fl_now() - w0;
  return NULL;
}

static int fl_shm_reflect(double seconds, int size, fl_refl *out) {
  uint8_t buf[256], src[24] = {0};
  mc_ring_hdr *ra = fl_ring_new(1024, 64 + 256), *rb = fl_ring_new(1024, 64 + 256);
  if (!ra || !rb) { free(ra); free(rb); return -ENOMEM; }
  memset(out, 0, sizeof(*out)); out->in = ra; out->out = rb;
  pthread_t th;
  if (pthread_create(&th, NULL, fl_shm_refl_main, out)) { free(ra); free(rb); return -EAGAIN; }
  memset(buf, 7, sizeof(buf));
  int64_t end = fl_now() + (int64_t)(seconds * 1e9);
  while (fl_now() < end) {
    for (int i = 0; i < 64; i++) if (mc_ring_push(ra, src, buf, (uint32_t)size) != 0) break;
    int k = 0;
    while (mc_ring_peek(rb, (uint64_t)k)) k++;
    if (k) mc_ring_release(rb, (uint64_t)k);
  }
  out->stop = 1;
  pthread_join(th, NULL);
  free(ra); free(rb);
  return 0;
}
#endif
