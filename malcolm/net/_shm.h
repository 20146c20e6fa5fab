/* Shared-memory transport helpers: each endpoint owns one inbound message ring (see _netc.h)
   in a POSIX shared-memory segment named "/malcolm-<endpoint name>". */
#ifndef MALCOLM_SHM_H
#define MALCOLM_SHM_H
#include "_netc.h"
#include <sys/mman.h>
#include <sys/stat.h>
#include <fcntl.h>
#include <stdio.h>
#include <signal.h>

/* The pid namespace this process's pids belong to: the inode of /proc/self/ns/pid, 0 where
   /proc does not say. Kept per process (a fork may be in another namespace); looked up once
   per endpoint and once per 1024 spins on a full ring, never per message. */
static inline uint64_t mc_pid_ns(void) {
  static int32_t pid_seen = 0;
  static uint64_t ns_seen = 0;
  int32_t pid = (int32_t)getpid();
  if (__atomic_load_n(&pid_seen, __ATOMIC_ACQUIRE) != pid) {
    struct stat st;
    __atomic_store_n(&ns_seen, stat("/proc/self/ns/pid", &st) == 0 ? (uint64_t)st.st_ino : 0,
                     __ATOMIC_RELAXED);
    __atomic_store_n(&pid_seen, pid, __ATOMIC_RELEASE);
  }
  return __atomic_load_n(&ns_seen, __ATOMIC_RELAXED);
}

static inline void mc_shm_path(const uint8_t name[16], char out[40]) {
  char n[17]; memcpy(n, name, 16); n[16] = 0;
  snprintf(out, 40, "/malcolm-%s", n);
}

/* Create (replacing any stale one) and map an endpoint's ring. NULL with errno on failure. */
static inline mc_ring_hdr *mc_shm_create(const uint8_t name[16], uint32_t capacity,
                                         uint32_t cell_bytes, size_t *size_out) {
  char path[40]; mc_shm_path(name, path);
  size_t size = mc_ring_bytes(capacity, cell_bytes);
  shm_unlink(path);
  int fd = shm_open(path, O_RDWR | O_CREAT | O_EXCL, 0600);
  if (fd < 0) return NULL;
  if (ftruncate(fd, (off_t)size) < 0) { int e = errno; close(fd); shm_unlink(path); errno = e; return NULL; }
  void *p = mmap(NULL, size, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
  int e = errno; close(fd);
  if (p == MAP_FAILED) { shm_unlink(path); errno = e; return NULL; }
  mc_ring_init((mc_ring_hdr *)p, capacity, cell_bytes, (int32_t)getpid(), mc_pid_ns());
  *size_out = size;
  return (mc_ring_hdr *)p;
}

/* Map a peer's ring. NULL with errno: ENOENT (no such endpoint), EPROTO (not a ring). */
static inline mc_ring_hdr *mc_shm_attach(const uint8_t name[16], size_t *size_out) {
  char path[40]; mc_shm_path(name, path);
  int fd = shm_open(path, O_RDWR, 0);
  if (fd < 0) return NULL;
  struct stat st;
  if (fstat(fd, &st) < 0 || (size_t)st.st_size < sizeof(mc_ring_hdr)) { close(fd); errno = EPROTO; return NULL; }
  size_t size = (size_t)st.st_size;
  void *p = mmap(NULL, size, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
  close(fd);
  if (p == MAP_FAILED) return NULL;
  mc_ring_hdr *r = (mc_ring_hdr *)p;
  if (__atomic_load_n(&r->magic, __ATOMIC_ACQUIRE) != MC_RING_MAGIC || r->capacity == 0 ||
      (r->capacity & (r->capacity - 1)) || mc_ring_bytes(r->capacity, r->cell_bytes) > size) {
    munmap(p, size); errno = EPROTO; return NULL;
  }
  *size_out = size;
  return r;
}

static inline void mc_shm_detach(mc_ring_hdr *r, size_t size) { munmap((void *)r, size); }

static inline void mc_shm_destroy(mc_ring_hdr *r, size_t size, const uint8_t name[16]) {
  char path[40]; mc_shm_path(name, path);
  __atomic_store_n(&r->alive, 0, __ATOMIC_RELEASE);
  munmap((void *)r, size);
  shm_unlink(path);
}

/* Was the ring made in another pid namespace than this process's? (Both known.) */
static inline int mc_shm_other_ns(const mc_ring_hdr *r) {
  uint64_t mine = mc_pid_ns();
  return r->owner_ns != 0 && mine != 0 && r->owner_ns != mine;
}

/* Is the owner of a ring still there? (A killed owner leaves alive == 1 behind.) An owner in
   another pid namespace (a container sharing /dev/shm) counts as there while alive is 1: its
   pid names nothing, or another process, here, and taking it for dead would let a second
   endpoint take a live one's name. */
static inline int mc_shm_owner_alive(mc_ring_hdr *r) {
  if (!__atomic_load_n(&r->alive, __ATOMIC_ACQUIRE)) return 0;
  if (mc_shm_other_ns(r)) return 1;
  return kill(r->owner_pid, 0) == 0 || errno == EPERM;
}
#endif
