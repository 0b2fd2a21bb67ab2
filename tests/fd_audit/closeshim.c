/* The suite's descriptor audit (issue 21), preloaded into every process `make test` starts.
 *
 * Some code in a pytest worker, about one whole-suite run in twelve, closes a descriptor it
 * does not own; whoever owns that number then fails with EBADF, far from the culprit. This
 * catches the culprit in the act instead, in the process where it happens:
 *   - a close() that fails with EBADF (the second close of a double close, the usual case):
 *     reported with this native stack and the native stack of the number's previous close;
 *   - a close() or dup2()/dup3() onto a descriptor that a live multiprocessing Connection holds,
 *     by anyone but that Connection (the Python side marks them: fd_audit_own/_legit).
 * Reports go to $FD_AUDIT_DIR/native.<pid>; where the process has a handler for signal 40
 * (tests/fd_audit/__init__.py registers faulthandler on it) the culprit's Python stack follows
 * in python.<pid>. Only the Python process that was exec'd with the shim watches: in any other
 * program, and in its fork and vfork children (where a lock another thread held at the fork, or
 * memory shared until exec, makes unwinding unsafe), every call goes straight to libc.
 */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <errno.h>
#include <execinfo.h>
#include <fcntl.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/syscall.h>
#include <time.h>
#include <unistd.h>

#define MAX_FD 4096
#define DEPTH 24
#define STACK_SIGNAL 40

struct closing { long tid; long long ns; int frames; void *stack[DEPTH]; };

static struct closing previous[MAX_FD];  /* each number's last successful close */
static unsigned char held[MAX_FD];       /* held by a live multiprocessing Connection */
static __thread int own_close = -1;      /* the number a Connection is closing itself, now */
static int (*real_close)(int);
static int (*real_dup2)(int, int);
static int (*real_dup3)(int, int, int);
static pid_t owner = -1;                 /* the Python process watched; -1: none */
static int log_fd = -2;                  /* -2: not opened yet, -1: no log */

void fd_audit_own(int fd) { if (fd >= 0 && fd < MAX_FD) held[fd] = 1; }
void fd_audit_legit(int fd) { own_close = fd; }
int fd_audit_loaded(void) { return 1; }

static long long now_ns(void) {
  struct timespec t;
  clock_gettime(CLOCK_MONOTONIC, &t);
  return t.tv_sec * 1000000000LL + t.tv_nsec;
}

static void __attribute__((constructor)) init(void) {
  real_close = dlsym(RTLD_NEXT, "close");
  real_dup2 = dlsym(RTLD_NEXT, "dup2");
  real_dup3 = dlsym(RTLD_NEXT, "dup3");
  /* Decided here, single-threaded: the loader's lock is never taken later, inside close(). */
  if (!getenv("FD_AUDIT_DIR") || !dlsym(RTLD_DEFAULT, "Py_IsInitialized")) return;
  void *warm[2];
  backtrace(warm, 2);  /* loads libgcc_s now, not at the first report */
  owner = syscall(SYS_getpid);
}

static int watching(void) { return owner > 0 && syscall(SYS_getpid) == owner; }

static void open_log(void) {
  if (log_fd != -2) return;
  log_fd = -1;
  const char *dir = getenv("FD_AUDIT_DIR");
  if (!dir) return;
  char path[1024];
  snprintf(path, sizeof path, "%s/native.%d", dir, (int)getpid());
  int fd = open(path, O_WRONLY | O_CREAT | O_APPEND | O_CLOEXEC, 0644);
  if (fd < 0) return;
  log_fd = fcntl(fd, F_DUPFD_CLOEXEC, 900);  /* out of the way of the numbers in play */
  real_close(fd);
}

static void say(const char *text) { if (write(log_fd, text, strlen(text)) < 0) return; }

static void report(const char *what, int fd) {
  open_log();
  if (log_fd < 0) return;
  long tid = syscall(SYS_gettid);
  char line[256];
  snprintf(line, sizeof line, "=== %s(%d) pid %d tid %ld at %lld ns\n", what, fd, (int)getpid(), tid, now_ns());
  say(line);
  void *stack[DEPTH];
  backtrace_symbols_fd(stack, backtrace(stack, DEPTH), log_fd);
  if (fd >= 0 && fd < MAX_FD && previous[fd].frames) {
    snprintf(line, sizeof line, "--- its previous close: tid %ld, %lld ns before\n", previous[fd].tid, now_ns() - previous[fd].ns);
    say(line);
    backtrace_symbols_fd(previous[fd].stack, previous[fd].frames, log_fd);
  }
  struct sigaction action;
  sigaction(STACK_SIGNAL, NULL, &action);
  if (action.sa_handler != SIG_DFL && action.sa_handler != SIG_IGN) {
    say("--- Python stack: python.<pid>\n");
    syscall(SYS_tgkill, getpid(), tid, STACK_SIGNAL);
  }
}

static int stolen(int fd) {
  return fd >= 0 && fd < MAX_FD && held[fd] && own_close != fd && watching();
}

int close(int fd) {
  if (!real_close) real_close = dlsym(RTLD_NEXT, "close");
  if (fd >= 0 && fd == log_fd) { errno = EBADF; return -1; }  /* a loop closing every number */
  int watched = watching();  /* not in a vfork child: its writes would land in our tables */
  if (watched && fd >= 0 && fd < MAX_FD) {
    if (held[fd] && own_close != fd) report("STOLEN close", fd);
    held[fd] = 0;
    own_close = -1;
  }
  int result = real_close(fd);
  int error = errno;
  if (watched) {
    if (result == 0 && fd >= 0 && fd < MAX_FD) {
      previous[fd].tid = syscall(SYS_gettid);
      previous[fd].ns = now_ns();
      previous[fd].frames = backtrace(previous[fd].stack, DEPTH);
    } else if (result == -1 && error == EBADF) {
      report("EBADF close", fd);
    }
  }
  errno = error;
  return result;
}

int dup2(int old_fd, int new_fd) {
  if (!real_dup2) real_dup2 = dlsym(RTLD_NEXT, "dup2");
  if (old_fd != new_fd && stolen(new_fd)) report("STOLEN dup2", new_fd);
  return real_dup2(old_fd, new_fd);
}

int dup3(int old_fd, int new_fd, int flags) {
  if (!real_dup3) real_dup3 = dlsym(RTLD_NEXT, "dup3");
  if (stolen(new_fd)) report("STOLEN dup3", new_fd);
  return real_dup3(old_fd, new_fd, flags);
}
