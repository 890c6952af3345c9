/*
 * session.c -- the process's one attachment to the node service (ibcmd), fork, errno.
 *
 * The session is opened on first use (the first event channel or id) on the socket named
 * by $IBCM_SOCKET, else /run/ibcmd/ibcmd.sock. A fork() child does not inherit it: libibcm
 * closes the child's copy of the socket (so the parent's connections end with the parent,
 * whatever the child does); in the child, the ids and channels it inherited fail with
 * EBADF, and the first new channel opens a session of the child's own.
 */
#include <errno.h>
#include <execinfo.h>
#include <signal.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "rdmacm.h"

#define DEFAULT_SOCKET "/run/ibcmd/ibcmd.sock"

pthread_mutex_t rc_lock = PTHREAD_MUTEX_INITIALIZER;
pthread_cond_t rc_acked = PTHREAD_COND_INITIALIZER;

static struct ibcm_ctx *session;
static pid_t session_pid;
static int trace_on = -1;

static void crash(int sig)
{
	void *frames[64];
	int n = backtrace(frames, 64);

	backtrace_symbols_fd(frames, n, 2);
	signal(sig, SIG_DFL);
	raise(sig);
}

void rc_trace(const char *fmt, ...)
{
	va_list ap;

	if (trace_on < 0) {
		trace_on = getenv("IBCM_RDMACM_TRACE") != NULL;
		if (trace_on) {
			/* with the trace, a crash of the process prints where it was */
			signal(SIGSEGV, crash);
			signal(SIGBUS, crash);
		}
	}
	if (!trace_on)
		return;
	fprintf(stderr, "librdmacm(ibcm) %d: ", (int)getpid());
	va_start(ap, fmt);
	vfprintf(stderr, fmt, ap);
	va_end(ap);
	fputc('\n', stderr);
}

int rc_forked(void)
{
	return session && session_pid != getpid();
}

struct ibcm_ctx *rc_session(void)
{
	const char *path;
	int st;

	if (session && session_pid == getpid())
		return session;
	if (session) {
		/* a fork child: forget the parent's (ibcm_close only forgets it here) */
		ibcm_close(session);
		session = NULL;
	}
	path = getenv("IBCM_SOCKET");
	if (!path || !*path)
		path = DEFAULT_SOCKET;
	st = ibcm_open(path, &session);
	if (st != IBCM_OK) {
		/* said once per failure, as an application has no other way to learn why */
		fprintf(stderr, "librdmacm (ibcm): cannot attach to the node service at %s: %s "
			"(set IBCM_SOCKET to ibcmd's --socket)\n", path, ibcm_last_error());
		session = NULL;
		errno = st == IBCM_EATTACH ? ENODEV : rc_errno(st);
		return NULL;
	}
	session_pid = getpid();
	rc_trace("attached to %s", path);
	return session;
}

int rc_session_fd(void)
{
	if (!session || session_pid != getpid())
		return -1;
	return ibcm_get_fd(session);
}

int rc_errno(int st)
{
	switch (st) {
	case IBCM_OK: return 0;
	case IBCM_EAGAIN: return EAGAIN;
	case IBCM_EINVAL: return EINVAL;
	case IBCM_ENOENT: return ENOENT;
	case IBCM_EBUSY: return EBUSY;
	case IBCM_ESTATE: return EINVAL;
	case IBCM_ETOOLONG: return EINVAL;
	case IBCM_EQPN: return EADDRINUSE;
	case IBCM_EREFUSED: return EADDRINUSE;
	case IBCM_EATTACH: return ENODEV;
	case IBCM_EGONE: return ENODEV;
	case IBCM_ECLOSED: return ECONNRESET;
	case IBCM_EUNSUPPORTED: return EOPNOTSUPP;
	case IBCM_EIO: return EIO;
	case IBCM_ENOPATH: return EHOSTUNREACH;
	case IBCM_ETIMEDOUT: return ETIMEDOUT;
	default: return EIO;
	}
}

int rc_fail(int st)
{
	rc_trace("libibcm: %s (%s)", ibcm_strerror(st), ibcm_last_error());
	errno = rc_errno(st);
	return -1;
}

int rc_err(int err)
{
	errno = err;
	return -1;
}
