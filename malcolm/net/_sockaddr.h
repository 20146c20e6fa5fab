/* Conversion between the wire's transport address (mc_addr: family, port, IPv6 scope id in
   `extra`, address bytes) and a socket address. One copy, for the udp transport (_udp.h) and
   the verbs transport's address socket (_verbs.pyx): a link-local IPv6 address needs its
   scope id both ways, or sendto() fails with EINVAL. */
#ifndef MALCOLM_SOCKADDR_H
#define MALCOLM_SOCKADDR_H
#include "_netc.h"
#include <string.h>
#include <sys/socket.h>
#include <netinet/in.h>
#include <arpa/inet.h>

/* 0, or -1 for a family other than IPv4/IPv6 (then *a is zeroed). */
static inline int mc_sa_to_addr(const struct sockaddr_storage *ss, mc_addr *a) {
  memset(a, 0, sizeof(*a));
  if (ss->ss_family == AF_INET) {
    const struct sockaddr_in *s = (const struct sockaddr_in *)ss;
    a->family = AF_INET; a->port = ntohs(s->sin_port);
    memcpy(a->addr, &s->sin_addr, 4);
    return 0;
  }
  if (ss->ss_family == AF_INET6) {
    const struct sockaddr_in6 *s = (const struct sockaddr_in6 *)ss;
    a->family = AF_INET6; a->port = ntohs(s->sin6_port); a->extra = s->sin6_scope_id;
    memcpy(a->addr, &s->sin6_addr, 16);
    return 0;
  }
  return -1;
}

/* The socket address's length, or 0 for a family other than IPv4/IPv6. */
static inline socklen_t mc_addr_to_sa(const mc_addr *a, struct sockaddr_storage *ss) {
  memset(ss, 0, sizeof(*ss));
  if (a->family == AF_INET) {
    struct sockaddr_in *s = (struct sockaddr_in *)ss;
    s->sin_family = AF_INET; s->sin_port = htons(a->port);
    memcpy(&s->sin_addr, a->addr, 4);
    return sizeof(*s);
  }
  if (a->family == AF_INET6) {
    struct sockaddr_in6 *s = (struct sockaddr_in6 *)ss;
    s->sin6_family = AF_INET6; s->sin6_port = htons(a->port); s->sin6_scope_id = a->extra;
    memcpy(&s->sin6_addr, a->addr, 16);
    return sizeof(*s);
  }
  return 0;
}
#endif
