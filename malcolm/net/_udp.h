/* UDP transport helpers: a nonblocking socket, batched recvmmsg/sendmmsg on preallocated
   buffers, and an eventfd so that other threads can wake a gateway blocked in poll(). */
#ifndef MALCOLM_UDP_H
#define MALCOLM_UDP_H
#include "_netc.h"
#include "_sockaddr.h"
#include <sys/socket.h>
#include <sys/eventfd.h>
#include <netinet/in.h>
#include <poll.h>
#include <fcntl.h>

#define MC_BATCH 64

typedef struct mc_udp {
  int fd, efd;
  uint32_t sleeping;
  uint32_t rx_cap;
  uint8_t *rxbuf, *txbuf;
  struct mmsghdr rx[MC_BATCH];
  struct iovec rxiov[MC_BATCH];
  struct sockaddr_storage rxsa[MC_BATCH];
  struct mmsghdr tx[MC_BATCH];
  struct iovec txiov[MC_BATCH];
  struct sockaddr_storage txsa[MC_BATCH];
} mc_udp;

/* Open and bind; returns 0 or -errno. `actual` gets the bound address (port 0 resolved). */
static inline int mc_udp_open(mc_udp *u, const mc_addr *bind_to, int bufbytes, uint32_t rx_cap,
                              uint8_t *rxbuf, uint8_t *txbuf, mc_addr *actual) {
  struct sockaddr_storage ss; socklen_t sl = mc_addr_to_sa(bind_to, &ss);
  memset(u, 0, sizeof(*u));
  u->fd = u->efd = -1;
  if (!sl) return -EAFNOSUPPORT;
  u->fd = socket(bind_to->family, SOCK_DGRAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
  if (u->fd < 0) return -errno;
  if (bufbytes > 0) {
    setsockopt(u->fd, SOL_SOCKET, SO_RCVBUF, &bufbytes, sizeof(bufbytes));
    setsockopt(u->fd, SOL_SOCKET, SO_SNDBUF, &bufbytes, sizeof(bufbytes));
  }
  if (bind(u->fd, (struct sockaddr *)&ss, sl) < 0) { int e = errno; close(u->fd); u->fd = -1; return -e; }
  sl = sizeof(ss);
  getsockname(u->fd, (struct sockaddr *)&ss, &sl);
  mc_sa_to_addr(&ss, actual);
  u->efd = eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC);
  if (u->efd < 0) { int e = errno; close(u->fd); u->fd = -1; return -e; }
  u->rx_cap = rx_cap; u->rxbuf = rxbuf; u->txbuf = txbuf;
  for (int i = 0; i < MC_BATCH; i++) {
    u->rxiov[i].iov_base = rxbuf + (size_t)i * rx_cap;
    u->rxiov[i].iov_len = rx_cap;
  }
  return 0;
}

static inline void mc_udp_close(mc_udp *u) {
  if (u->fd >= 0) close(u->fd);
  if (u->efd >= 0) close(u->efd);
  u->fd = u->efd = -1;
}

/* Receive up to max datagrams; returns the count (0 when none is waiting). */
static inline int mc_udp_recv(mc_udp *u, int max) {
  if (max > MC_BATCH) max = MC_BATCH;
  for (int i = 0; i < max; i++) {
    u->rx[i].msg_hdr.msg_name = &u->rxsa[i];
    u->rx[i].msg_hdr.msg_namelen = sizeof(u->rxsa[i]);
    u->rx[i].msg_hdr.msg_iov = &u->rxiov[i];
    u->rx[i].msg_hdr.msg_iovlen = 1;
    u->rx[i].msg_hdr.msg_control = NULL;
    u->rx[i].msg_hdr.msg_controllen = 0;
    u->rx[i].msg_hdr.msg_flags = 0;
  }
  int n = recvmmsg(u->fd, u->rx, max, MSG_DONTWAIT, NULL);
  return n < 0 ? 0 : n;
}

/* Send n staged datagrams (buffer i is txbuf + i*rx_cap). Returns n; a datagram the
   kernel refuses for good, or whose send buffer stays full for ~20 ms, is counted in
   *dropped (the gateway must not stall longer than that). */
static inline int mc_udp_send(mc_udp *u, const uint32_t *lens, const mc_addr *dsts, int n,
                              uint64_t *dropped) {
  int sent = 0, i, again = 0;
  for (i = 0; i < n; i++) {
    u->txiov[i].iov_base = u->txbuf + (size_t)i * u->rx_cap;
    u->txiov[i].iov_len = lens[i];
    memset(&u->tx[i].msg_hdr, 0, sizeof(u->tx[i].msg_hdr));
    u->tx[i].msg_hdr.msg_name = &u->txsa[i];
    u->tx[i].msg_hdr.msg_namelen = mc_addr_to_sa(&dsts[i], &u->txsa[i]);
    u->tx[i].msg_hdr.msg_iov = &u->txiov[i];
    u->tx[i].msg_hdr.msg_iovlen = 1;
  }
  while (sent < n) {
    int r = sendmmsg(u->fd, u->tx + sent, n - sent, MSG_DONTWAIT);
    if (r > 0) { sent += r; again = 0; continue; }
    if (r < 0 && (errno == EAGAIN || errno == EWOULDBLOCK || errno == ENOBUFS || errno == EINTR)
        && again++ < 20) {
      struct pollfd p = {u->fd, POLLOUT, 0};
      poll(&p, 1, 1);
      continue;
    }
    /* This datagram cannot go (bad address, unreachable, or a buffer that stays full). */
    (*dropped)++;
    u->tx[sent].msg_len = 0;
    sent++;
    again = 0;
  }
  return n;
}

static inline void mc_udp_prepare(mc_udp *u) { __atomic_store_n(&u->sleeping, 1, __ATOMIC_SEQ_CST); }
static inline void mc_udp_cancel(mc_udp *u) { __atomic_store_n(&u->sleeping, 0, __ATOMIC_RELAXED); }

/* Block until a datagram is waiting, mc_udp_wake is called, or the timeout passes. */
static inline int mc_udp_wait(mc_udp *u, int64_t timeout_ns) {
  struct pollfd p[2] = {{u->fd, POLLIN, 0}, {u->efd, POLLIN, 0}};
  struct timespec ts, *tp = NULL;
  if (timeout_ns >= 0) { ts.tv_sec = timeout_ns / 1000000000ll; ts.tv_nsec = timeout_ns % 1000000000ll; tp = &ts; }
  int r = ppoll(p, 2, tp, NULL);
  __atomic_store_n(&u->sleeping, 0, __ATOMIC_RELAXED);
  if (r > 0 && (p[1].revents & POLLIN)) { uint64_t v; ssize_t k = read(u->efd, &v, 8); (void)k; }
  return r;
}

static inline void mc_udp_wake(mc_udp *u) {
  __atomic_thread_fence(__ATOMIC_SEQ_CST);
  if (__atomic_load_n(&u->sleeping, __ATOMIC_RELAXED)) {
    uint64_t one = 1; ssize_t k = write(u->efd, &one, 8); (void)k;
  }
}
#endif
