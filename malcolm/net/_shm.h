/* Shared-memory transport helpers: each endpoint owns one inbound message ring (see _netc.h)
   in a POSIX shared-memory segment named "/malcolm-<endpoint name>". */
#ifndef MALCOLM_SHM_H
#define MALCOLM_SHM_H
#include "_netc.h"
#include <sys/mman.h>
#include <sys/stat.h>
#include <sys/file.h>
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

/* Create (replacing any stale one) and map an endpoint's ring, and lock its file (flock,
   exclusive) for as long as the endpoint lives: *fd_out keeps it (close it after
   mc_shm_destroy). NULL with errno on failure. */
static inline mc_ring_hdr *mc_shm_create(const uint8_t name[16], uint32_t capacity,
                                         uint32_t cell_bytes, size_t *size_out, int *fd_out) {
  char path[40]; mc_shm_path(name, path);
  size_t size = mc_ring_bytes(capacity, cell_bytes);
  shm_unlink(path);
  int fd = shm_open(path, O_RDWR | O_CREAT | O_EXCL, 0600);     /* FD_CLOEXEC: POSIX */
  if (fd < 0) return NULL;
  if (ftruncate(fd, (off_t)size) < 0) { int e = errno; close(fd); shm_unlink(path); errno = e; return NULL; }
  void *p = mmap(NULL, size, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
  if (p == MAP_FAILED) { int e = errno; close(fd); shm_unlink(path); errno = e; return NULL; }
  /* a new file, so nobody else holds it; where flock is not supported the ring says so and
     its owner is judged by its pid, as rings made before the lock are */
  uint32_t flags = flock(fd, LOCK_EX | LOCK_NB) == 0 ? MC_RING_LOCKED : 0;
  mc_ring_init((mc_ring_hdr *)p, capacity, cell_bytes, (int32_t)getpid(), mc_pid_ns(), flags);
  *size_out = size;
  *fd_out = fd;
  return (mc_ring_hdr *)p;
}

/* Mark the ring of an owner that is gone as stopped: a peer that still maps it (it was
   killed, so alive stayed 1) then drops the mapping at its next send and attaches to the
   name afresh, which reaches the endpoint that took the name over. */
static inline void mc_shm_mark_stopped(mc_ring_hdr *r) {
  __atomic_store_n(&r->alive, 0, __ATOMIC_RELEASE);
}

/* Does a running process hold the lock of the ring file named `name`? 1 yes, 0 no, -1 the
   file cannot be opened. A shared lock taken without waiting fails only while the owner
   holds its exclusive one (on another open file: even the owner's own process is told). */
static inline int mc_shm_lock_held(const uint8_t name[16]) {
  char path[40]; mc_shm_path(name, path);
  int fd = shm_open(path, O_RDONLY, 0);
  if (fd < 0) return -1;
  int held = flock(fd, LOCK_SH | LOCK_NB) != 0 && errno == EWOULDBLOCK;
  close(fd);                  /* and the shared lock with it */
  return held;
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

/* Stop an endpoint: mark its ring stopped, unmap it, unlink its name if the name is still
   this ring's (not a newer endpoint's that took it over), and close its file (the lock). */
static inline void mc_shm_destroy(mc_ring_hdr *r, size_t size, const uint8_t name[16], int fd) {
  char path[40]; mc_shm_path(name, path);
  struct stat mine, now;
  __atomic_store_n(&r->alive, 0, __ATOMIC_RELEASE);
  munmap((void *)r, size);
  int probe = shm_open(path, O_RDONLY, 0);
  if (probe >= 0) {
    if (fd < 0 || (fstat(fd, &mine) == 0 && fstat(probe, &now) == 0 &&
                   mine.st_dev == now.st_dev && mine.st_ino == now.st_ino))
      shm_unlink(path);
    close(probe);
  }
  if (fd >= 0) close(fd);
}

/* Was the ring made in another pid namespace than this process's? (Both known.) */
static inline int mc_shm_other_ns(const mc_ring_hdr *r) {
  uint64_t mine = mc_pid_ns();
  return r->owner_ns != 0 && mine != 0 && r->owner_ns != mine;
}

/* Is the owner of a ring still there, by its pid? (A killed owner leaves alive == 1 behind.)
   An owner in another pid namespace (a container sharing /dev/shm) counts as there while
   alive is 1: its pid names nothing, or another process, here. For the sender's wait on a
   full ring, a system call once per 1024 spins; mc_shm_owner_running is the exact test. */
static inline int mc_shm_owner_alive(mc_ring_hdr *r) {
  if (!__atomic_load_n(&r->alive, __ATOMIC_ACQUIRE)) return 0;
  if (mc_shm_other_ns(r)) return 1;
  return kill(r->owner_pid, 0) == 0 || errno == EPERM;
}

/* Is the owner of ring r, mapped from the file named `name`, still running? By the file's
   lock where the ring has one (whatever namespace or pid it came from), else by its pid. */
static inline int mc_shm_owner_running(mc_ring_hdr *r, const uint8_t name[16]) {
  if (!__atomic_load_n(&r->alive, __ATOMIC_ACQUIRE)) return 0;
  if (r->owner_flags & MC_RING_LOCKED) {
    int held = mc_shm_lock_held(name);
    if (held >= 0) return held;
  }
  return mc_shm_owner_alive(r);
}
#endif
