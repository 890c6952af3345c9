/*
 * rdmacm.c -- ibcm's librdmacm drop-in (cm/rdmacm) seen by an rdma-core application on a
 * host without an RDMA device.
 *
 *   rdmacm DROPIN_SO NO_DAEMON_SOCKET SOCKET PEER PEER_SOCKET SERVER_IP
 *
 * Compiled against rdma-core's own <rdma/rdma_cma.h> and linked with -lrdmacm -libverbs
 * against rdma-core's librdmacm.so.1, as any application; run with LD_LIBRARY_PATH naming
 * the drop-in's directory. DROPIN_SO is the drop-in's librdmacm.so.1: the run stops at once
 * when rdma_create_id comes from another file. NO_DAEMON_SOCKET is a path where no ibcmd
 * listens, SOCKET the ibcmd of SERVER_IP (each used as $IBCM_SOCKET in turn); PEER is
 * tests/c-abi/rdmacm_peer, run against PEER_SOCKET (the other daemon) to send REQs to the
 * listeners here. Each check prints "rdmacm: check N: ..."; the first that fails prints
 * "rdmacm: FAIL: check N (what): ..." and exits 1. The last line is
 * "rdmacm: N checks passed".
 *
 * Without an RDMA device no address resolves and no connection gets a QP, so these are the
 * contract's other parts: the attachment to ibcmd, the event channel as an fd, ids and port
 * spaces, ports (rdma_cm's service IDs at the daemon), ADDR_ERROR, rdma_getaddrinfo,
 * rdma_get_devices, rdma_event_str, what is unsupported, options, calls in the wrong state,
 * rdma_migrate_id, destruction, fork(), the synchronous calls, and the passive side of a
 * REQ up to its reject.
 */
#define _GNU_SOURCE
#include <arpa/inet.h>
#include <dlfcn.h>
#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <netinet/in.h>
#include <poll.h>
#include <spawn.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/epoll.h>
#include <sys/wait.h>
#include <unistd.h>

#include <infiniband/verbs.h>
#include <rdma/rdma_cma.h>
#include <rdma/rsocket.h>

/* rdma_cm ports of this test at the daemon (rdma_cm service IDs 0x0106xxxx). */
#define PORT_LISTEN 7610   /* bind + listen, a second id, a fork child's listen */
#define PORT_PEER 7611     /* the listener the peer's REQs reach */
#define PEER_QPN 0x3100    /* the peer's QP numbers (one per REQ) */

extern char **environ;

static int checks;
static const char *what = "start";
static int in_child;  /* a fork child: fail() leaves with _exit */

static void fail(const char *fmt, ...) __attribute__((format(printf, 1, 2), noreturn));
static void fail(const char *fmt, ...)
{
    va_list ap;

    fflush(stdout);
    fprintf(stderr, "rdmacm: FAIL: check %d (%s): ", checks, what);
    va_start(ap, fmt);
    vfprintf(stderr, fmt, ap);
    va_end(ap);
    fputc('\n', stderr);
    if (in_child)
        _exit(1);
    exit(1);
}

#define need(cond, ...) do { if (!(cond)) fail(__VA_ARGS__); } while (0)

/* Starts check N+1, named `name`. */
static void begin(const char *name)
{
    checks++;
    what = name;
}

/* The current check passed; `fmt` says what was seen. */
static void pass(const char *fmt, ...) __attribute__((format(printf, 1, 2)));
static void pass(const char *fmt, ...)
{
    va_list ap;

    printf("rdmacm: check %d: %s: ", checks, what);
    va_start(ap, fmt);
    vprintf(fmt, ap);
    va_end(ap);
    putchar('\n');
    fflush(stdout);
}

static const char *err_name(int e)
{
    const char *n = strerrorname_np(e);

    return n ? n : "?";
}

/* `ret` must be -1 with errno `err`. */
static void want_errno(int ret, int err, const char *call)
{
    int e = errno;

    need(ret == -1 && e == err, "%s returned %d, errno %s (%s); wanted -1 with %s", call, ret,
         err_name(e), strerror(e), err_name(err));
}

/* `ret` must be 0. */
static void want_ok(int ret, const char *call)
{
    int e = errno;

    need(ret == 0, "%s returned %d, errno %s (%s); wanted 0", call, ret, err_name(e),
         strerror(e));
}

/* poll(2) of `fd` for POLLIN: 1 readable, 0 not within `ms`; fails on POLLNVAL/POLLERR. */
static int readable(int fd, int ms)
{
    struct pollfd p = { .fd = fd, .events = POLLIN };
    int n = poll(&p, 1, ms);

    need(n >= 0, "poll: %s", strerror(errno));
    need(!(p.revents & (POLLNVAL | POLLERR)), "poll of fd %d: revents %#x", fd, p.revents);
    return n == 1 && (p.revents & POLLIN);
}

static struct sockaddr_in ip4(const char *ip, uint16_t port)
{
    struct sockaddr_in a;

    memset(&a, 0, sizeof(a));
    a.sin_family = AF_INET;
    a.sin_port = htons(port);
    if (inet_pton(AF_INET, ip, &a.sin_addr) != 1)
        fail("bad IPv4 address %s", ip);
    return a;
}

static const char *addr_str(const struct sockaddr *sa, char *buf, size_t len)
{
    const struct sockaddr_in *s4 = (const struct sockaddr_in *)sa;
    const struct sockaddr_in6 *s6 = (const struct sockaddr_in6 *)sa;
    char ip[INET6_ADDRSTRLEN] = "?";

    if (sa->sa_family == AF_INET) {
        inet_ntop(AF_INET, &s4->sin_addr, ip, sizeof(ip));
        snprintf(buf, len, "%s:%u", ip, ntohs(s4->sin_port));
    } else if (sa->sa_family == AF_INET6) {
        inet_ntop(AF_INET6, &s6->sin6_addr, ip, sizeof(ip));
        snprintf(buf, len, "[%s]:%u", ip, ntohs(s6->sin6_port));
    } else {
        snprintf(buf, len, "family %d", sa->sa_family);
    }
    return buf;
}

static struct rdma_cm_id *new_id(struct rdma_event_channel *ch, void *ctx,
                                 enum rdma_port_space ps)
{
    struct rdma_cm_id *id = NULL;

    want_ok(rdma_create_id(ch, &id, ctx, ps), "rdma_create_id");
    need(id != NULL, "rdma_create_id returned 0 and no id");
    return id;
}

static void listen_on(struct rdma_cm_id *id, uint16_t port)
{
    struct sockaddr_in any = ip4("0.0.0.0", port);

    want_ok(rdma_bind_addr(id, (struct sockaddr *)&any), "rdma_bind_addr");
    want_ok(rdma_listen(id, 8), "rdma_listen");
}

/* The next event of `ch`, waited for with poll(2) on its fd (at most `ms`). */
static struct rdma_cm_event *next_event(struct rdma_event_channel *ch, int ms)
{
    struct rdma_cm_event *ev = NULL;

    need(readable(ch->fd, ms), "no event on the channel's fd within %d ms", ms);
    want_ok(rdma_get_cm_event(ch, &ev), "rdma_get_cm_event");
    need(ev != NULL, "rdma_get_cm_event returned 0 and no event");
    return ev;
}

/* rdma_resolve_addr to 127.0.0.1 and its event: ADDR_ERROR, -ENODEV (no device has it). */
static void addr_error(struct rdma_event_channel *ch, struct rdma_cm_id *id)
{
    struct sockaddr_in dst = ip4("127.0.0.1", 7);
    struct rdma_cm_event *ev;

    want_ok(rdma_resolve_addr(id, NULL, (struct sockaddr *)&dst, 2000), "rdma_resolve_addr");
    ev = next_event(ch, 5000);
    need(ev->event == RDMA_CM_EVENT_ADDR_ERROR && ev->status == -ENODEV && ev->id == id &&
         ev->listen_id == NULL,
         "got %s status %d (id %s), wanted RDMA_CM_EVENT_ADDR_ERROR status -ENODEV on the id",
         rdma_event_str(ev->event), ev->status, ev->id == id ? "the id" : "another");
    want_ok(rdma_ack_cm_event(ev), "rdma_ack_cm_event");
}

/* Runs the peer (rdmacm_peer) against `port`; returns its PID. */
static pid_t spawn_peer(char **argv, uint16_t port, unsigned qpn, const char *pd,
                        const char *rej_pd)
{
    char dst[64], qp[16];
    pid_t pid;
    int rc;

    snprintf(dst, sizeof(dst), "%s:%u", argv[6], port);
    snprintf(qp, sizeof(qp), "%#x", qpn);
    char *args[] = { argv[4], argv[5], dst, qp, (char *)pd, (char *)rej_pd, NULL };
    fflush(stdout);
    rc = posix_spawn(&pid, argv[4], NULL, NULL, args, environ);
    need(rc == 0, "posix_spawn %s: %s", argv[4], strerror(rc));
    return pid;
}

static void peer_done(pid_t pid)
{
    int st;

    need(waitpid(pid, &st, 0) == pid, "waitpid: %s", strerror(errno));
    need(WIFEXITED(st) && WEXITSTATUS(st) == 0, "the peer (rdmacm_peer) failed: status %#x", st);
}

/* The CONNECT_REQUEST of a peer's REQ on `ch`, checked; returns the request's id, and in
 * `seen` what it was. */
static struct rdma_cm_id *peer_request(struct rdma_event_channel *ch, struct rdma_cm_id *l,
                                       void *ctx, const char *server_ip, unsigned qpn,
                                       const char *pd, char *seen, size_t seen_len)
{
    struct rdma_cm_event *ev = next_event(ch, 30000);
    struct rdma_cm_id *id = ev->id;
    struct sockaddr_in want_src = ip4(server_ip, PORT_PEER);
    struct sockaddr_in *src = (struct sockaddr_in *)rdma_get_local_addr(id);
    struct sockaddr_in *dst = (struct sockaddr_in *)rdma_get_peer_addr(id);
    char s[64], d[64];

    need(ev->event == RDMA_CM_EVENT_CONNECT_REQUEST && ev->status == 0,
         "got %s status %d, wanted RDMA_CM_EVENT_CONNECT_REQUEST", rdma_event_str(ev->event),
         ev->status);
    need(ev->listen_id == l && id != l && id->context == ctx && id->channel == ch &&
         id->ps == RDMA_PS_TCP && id->qp_type == IBV_QPT_RC && id->qp == NULL,
         "the request's id: listen_id %s, context %p, channel %s, ps %#x, qp_type %d",
         ev->listen_id == l ? "the listener" : "other", id->context,
         id->channel == ch ? "the listener's" : "other", id->ps, id->qp_type);
    need(ev->param.conn.qp_num == qpn, "param.conn.qp_num %#x, wanted the peer's %#x",
         ev->param.conn.qp_num, qpn);
    need(ev->param.conn.private_data_len == 56 && ev->param.conn.private_data &&
         memcmp(ev->param.conn.private_data, pd, strlen(pd)) == 0,
         "private data: %u bytes, wanted 56 (a REQ's after the CMA header) starting \"%s\"",
         ev->param.conn.private_data_len, pd);
    need(src->sin_family == AF_INET && src->sin_addr.s_addr == want_src.sin_addr.s_addr &&
         rdma_get_src_port(id) == htons(PORT_PEER),
         "the request's local address %s, wanted %s:%u",
         addr_str((struct sockaddr *)src, s, sizeof(s)), server_ip, PORT_PEER);
    need(dst->sin_family == AF_INET && rdma_get_dst_port(id) != 0 &&
         dst->sin_addr.s_addr != want_src.sin_addr.s_addr,
         "the request's peer address %s", addr_str((struct sockaddr *)dst, d, sizeof(d)));
    snprintf(seen, seen_len, "from %s to %s, peer QPN %#x, 56 bytes of private data starting "
             "\"%s\"", addr_str((struct sockaddr *)dst, d, sizeof(d)),
             addr_str((struct sockaddr *)src, s, sizeof(s)), qpn, pd);
    want_ok(rdma_ack_cm_event(ev), "rdma_ack_cm_event");
    return id;
}

int main(int argc, char **argv)
{
    if (argc != 7) {
        fprintf(stderr, "usage: rdmacm DROPIN_SO NO_DAEMON_SOCKET SOCKET PEER PEER_SOCKET "
                "SERVER_IP\n");
        return 2;
    }
    const char *server_ip = argv[6];
    struct rdma_event_channel *ch, *ch2;
    struct rdma_cm_event *ev;
    struct rdma_cm_id *id, *l;
    char buf[128];
    int ret;

    /* Which librdmacm the dynamic linker gave this program. */
    {
        Dl_info info;
        char got[PATH_MAX], want[PATH_MAX];

        begin("the drop-in is the librdmacm loaded");
        need(dladdr((void *)rdma_create_id, &info) && info.dli_fname,
             "dladdr(rdma_create_id) found no file");
        need(realpath(info.dli_fname, got) && realpath(argv[1], want),
             "realpath of %s or %s: %s", info.dli_fname, argv[1], strerror(errno));
        need(strcmp(got, want) == 0,
             "rdma_create_id comes from %s, not from the drop-in %s (LD_LIBRARY_PATH?)", got,
             want);
        pass("rdma_create_id from %s", got);
    }

    /* No daemon: no channel, ENODEV, and one line on stderr that says why. */
    {
        char line[1024];
        int pfd[2], saved;
        ssize_t n;

        begin("no ibcmd at $IBCM_SOCKET");
        setenv("IBCM_SOCKET", argv[2], 1);
        need(pipe2(pfd, O_NONBLOCK) == 0 && (saved = dup(2)) >= 0, "pipe/dup: %s",
             strerror(errno));
        fflush(stderr);
        dup2(pfd[1], 2);
        errno = 0;
        ch = rdma_create_event_channel();
        ret = errno;
        fflush(stderr);
        dup2(saved, 2);
        close(saved);
        close(pfd[1]);
        memset(line, 0, sizeof(line));
        n = read(pfd[0], line, sizeof(line) - 1);
        close(pfd[0]);
        need(ch == NULL && ret == ENODEV,
             "rdma_create_event_channel returned %p, errno %s; wanted NULL with ENODEV",
             (void *)ch, err_name(ret));
        need(n > 0 && strchr(line, '\n') == line + n - 1 && strstr(line, argv[2]) &&
             strstr(line, "IBCM_SOCKET"),
             "stderr: \"%s\"; wanted one line naming %s and IBCM_SOCKET", n > 0 ? line : "",
             argv[2]);
        line[n - 1] = 0;
        pass("rdma_create_event_channel -> NULL, ENODEV; stderr: %s", line);
    }

    setenv("IBCM_SOCKET", argv[3], 1);
    ch = rdma_create_event_channel();
    need(ch != NULL, "rdma_create_event_channel with ibcmd at %s: %s", argv[3], strerror(errno));

    {
        int ep = epoll_create1(EPOLL_CLOEXEC);
        struct epoll_event ee = { .events = EPOLLIN };

        begin("the channel's fd is pollable, not readable while empty");
        need(ch->fd >= 0, "channel->fd %d", ch->fd);
        need(!readable(ch->fd, 0), "readable with no event");
        need(ep >= 0 && epoll_ctl(ep, EPOLL_CTL_ADD, ch->fd, &ee) == 0 &&
             epoll_wait(ep, &ee, 1, 0) == 0, "epoll of the channel's fd: %s", strerror(errno));
        close(ep);
        pass("poll(2) and epoll(7) of fd %d: not readable", ch->fd);
    }

    {
        int fl = fcntl(ch->fd, F_GETFL);

        begin("O_NONBLOCK on channel->fd");
        need(fl >= 0 && fcntl(ch->fd, F_SETFL, fl | O_NONBLOCK) == 0, "fcntl: %s",
             strerror(errno));
        ev = NULL;
        want_errno(rdma_get_cm_event(ch, &ev), EAGAIN, "rdma_get_cm_event (O_NONBLOCK)");
        need(fcntl(ch->fd, F_SETFL, fl) == 0, "fcntl: %s", strerror(errno));
        pass("rdma_get_cm_event with no event -> EAGAIN");
    }

    {
        static const struct {
            enum rdma_port_space ps;
            enum ibv_qp_type qpt;
            const char *name;
        } spaces[] = {
            { RDMA_PS_TCP, IBV_QPT_RC, "RDMA_PS_TCP/RC" },
            { RDMA_PS_UDP, IBV_QPT_UD, "RDMA_PS_UDP/UD" },
            { RDMA_PS_IB, IBV_QPT_RC, "RDMA_PS_IB/RC" },
            { RDMA_PS_IPOIB, IBV_QPT_UD, "RDMA_PS_IPOIB/UD" },
        };
        int ctx;

        begin("rdma_create_id in each port space");
        buf[0] = 0;
        for (size_t i = 0; i < sizeof(spaces) / sizeof(spaces[0]); i++) {
            id = new_id(ch, &ctx, spaces[i].ps);
            need(id->channel == ch && id->context == &ctx && id->ps == spaces[i].ps &&
                 id->qp_type == spaces[i].qpt && id->verbs == NULL && id->qp == NULL,
                 "%s: channel %p, context %p, ps %#x, qp_type %d, verbs %p", spaces[i].name,
                 (void *)id->channel, id->context, id->ps, id->qp_type, (void *)id->verbs);
            want_ok(rdma_destroy_id(id), "rdma_destroy_id");
            strncat(buf, i ? ", " : "", sizeof(buf) - strlen(buf) - 1);
            strncat(buf, spaces[i].name, sizeof(buf) - strlen(buf) - 1);
        }
        id = NULL;
        want_errno(rdma_create_id(ch, &id, NULL, (enum rdma_port_space)0x0123), EINVAL,
                   "rdma_create_id (port space 0x123)");
        need(id == NULL, "an id for a bad port space");
        pass("%s; port space 0x123 -> EINVAL", buf);
    }

    begin("rdma_bind_addr to an address no RDMA device has");
    {
        struct sockaddr_in lo = ip4("127.0.0.1", PORT_LISTEN);

        id = new_id(ch, NULL, RDMA_PS_TCP);
        want_errno(rdma_bind_addr(id, (struct sockaddr *)&lo), EADDRNOTAVAIL,
                   "rdma_bind_addr (127.0.0.1)");
        listen_on(id, PORT_LISTEN); /* the id stayed unbound: 0.0.0.0 still binds */
        want_ok(rdma_destroy_id(id), "rdma_destroy_id");
        pass("127.0.0.1 -> EADDRNOTAVAIL, the id stays unbound (0.0.0.0 binds it after)");
    }

    begin("rdma_bind_addr + rdma_listen, a second listener on the port");
    l = new_id(ch, (void *)0x1, RDMA_PS_TCP);
    listen_on(l, PORT_LISTEN);
    need(rdma_get_src_port(l) == htons(PORT_LISTEN), "rdma_get_src_port %u, wanted %u",
         ntohs(rdma_get_src_port(l)), PORT_LISTEN);
    {
        struct sockaddr_in any = ip4("0.0.0.0", PORT_LISTEN);

        id = new_id(ch, NULL, RDMA_PS_TCP);
        want_ok(rdma_bind_addr(id, (struct sockaddr *)&any), "rdma_bind_addr (second id)");
        want_errno(rdma_listen(id, 8), EADDRINUSE, "rdma_listen (second id, same port)");
        want_ok(rdma_destroy_id(id), "rdma_destroy_id");
        /* RDMA_PS_UDP's port 7610 is another service ID (0x0111xxxx, not 0x0106xxxx) */
        id = new_id(ch, NULL, RDMA_PS_UDP);
        listen_on(id, PORT_LISTEN);
        want_ok(rdma_destroy_id(id), "rdma_destroy_id");
    }
    pass("0.0.0.0:%u listens (rdma_get_src_port %u); a second RDMA_PS_TCP id there -> "
         "EADDRINUSE; RDMA_PS_UDP's port %u listens", PORT_LISTEN, ntohs(rdma_get_src_port(l)),
         PORT_LISTEN);

    begin("rdma_listen picks an ephemeral port");
    {
        struct sockaddr_in any = ip4("0.0.0.0", 0);
        struct sockaddr_in *src;
        uint16_t p1, p2;

        id = new_id(ch, NULL, RDMA_PS_TCP);
        want_ok(rdma_bind_addr(id, (struct sockaddr *)&any), "rdma_bind_addr (port 0)");
        want_ok(rdma_listen(id, 8), "rdma_listen (port 0)");
        src = (struct sockaddr_in *)rdma_get_local_addr(id);
        p1 = ntohs(rdma_get_src_port(id));
        need(p1 != 0 && src->sin_port == htons(p1), "rdma_get_src_port %u after a listen on "
             "port 0", p1);
        /* one at a time: the drop-in draws the port without asking the daemon first */
        want_ok(rdma_destroy_id(id), "rdma_destroy_id");
        id = new_id(ch, NULL, RDMA_PS_TCP);
        want_ok(rdma_listen(id, 8), "rdma_listen (never bound)");
        p2 = ntohs(rdma_get_src_port(id));
        need(p2 != 0, "rdma_get_src_port 0 after a listen of an unbound id");
        want_ok(rdma_destroy_id(id), "rdma_destroy_id");
        pass("bound to 0.0.0.0:0 -> port %u; never bound -> port %u", p1, p2);
    }

    begin("rdma_resolve_addr to 127.0.0.1");
    id = new_id(ch, NULL, RDMA_PS_TCP);
    addr_error(ch, id);
    need(!readable(ch->fd, 0), "the channel's fd is readable after the only event was taken");
    {
        struct sockaddr_in *dst = (struct sockaddr_in *)rdma_get_peer_addr(id);
        struct sockaddr_in lo = ip4("127.0.0.1", 7);

        need(dst->sin_family == AF_INET && dst->sin_addr.s_addr == lo.sin_addr.s_addr,
             "rdma_get_peer_addr: %s", addr_str((struct sockaddr *)dst, buf, sizeof(buf)));
    }
    want_errno(rdma_resolve_route(id, 2000), EINVAL, "rdma_resolve_route (address unresolved)");
    want_ok(rdma_destroy_id(id), "rdma_destroy_id");
    pass("poll(2) on channel->fd, then rdma_get_cm_event: RDMA_CM_EVENT_ADDR_ERROR, status "
         "-ENODEV (no RDMA device has 127.0.0.1); rdma_resolve_route after it -> EINVAL");

    begin("rdma_getaddrinfo, rdma_freeaddrinfo");
    {
        struct rdma_addrinfo hints, *res = NULL;
        struct sockaddr_in *sa;
        char s1[64], s2[64], s3[64];

        memset(&hints, 0, sizeof(hints));
        hints.ai_flags = RAI_PASSIVE | RAI_NUMERICHOST;
        hints.ai_port_space = RDMA_PS_UDP;
        want_ok(rdma_getaddrinfo("127.0.0.1", "7612", &hints, &res), "rdma_getaddrinfo (passive)");
        sa = (struct sockaddr_in *)res->ai_src_addr;
        need(res->ai_flags & RAI_PASSIVE && res->ai_family == AF_INET &&
             res->ai_port_space == RDMA_PS_UDP && res->ai_qp_type == IBV_QPT_UD && sa &&
             res->ai_src_len == sizeof(*sa) && sa->sin_port == htons(7612) &&
             sa->sin_addr.s_addr == htonl(INADDR_LOOPBACK) && res->ai_dst_addr == NULL,
             "passive: flags %#x, family %d, port space %#x, qp type %d, src %p, dst %p",
             res->ai_flags, res->ai_family, res->ai_port_space, res->ai_qp_type,
             (void *)res->ai_src_addr, (void *)res->ai_dst_addr);
        addr_str(res->ai_src_addr, s1, sizeof(s1));
        rdma_freeaddrinfo(res);

        memset(&hints, 0, sizeof(hints));
        hints.ai_flags = RAI_PASSIVE;
        hints.ai_family = AF_INET;
        res = NULL;
        want_ok(rdma_getaddrinfo(NULL, "7612", &hints, &res), "rdma_getaddrinfo (wildcard)");
        sa = (struct sockaddr_in *)res->ai_src_addr;
        need(sa && sa->sin_addr.s_addr == htonl(INADDR_ANY) && sa->sin_port == htons(7612) &&
             res->ai_port_space == RDMA_PS_TCP && res->ai_qp_type == IBV_QPT_RC,
             "wildcard: src %p, port space %#x, qp type %d", (void *)sa, res->ai_port_space,
             res->ai_qp_type);
        addr_str(res->ai_src_addr, s2, sizeof(s2));
        rdma_freeaddrinfo(res);

        memset(&hints, 0, sizeof(hints));
        hints.ai_flags = RAI_NUMERICHOST;
        hints.ai_port_space = RDMA_PS_TCP;
        hints.ai_qp_type = IBV_QPT_RC;
        res = NULL;
        want_ok(rdma_getaddrinfo("192.0.2.7", "7612", &hints, &res), "rdma_getaddrinfo (active)");
        sa = (struct sockaddr_in *)res->ai_dst_addr;
        need(!(res->ai_flags & RAI_PASSIVE) && res->ai_family == AF_INET && sa &&
             res->ai_dst_len == sizeof(*sa) && sa->sin_port == htons(7612) &&
             ntohl(sa->sin_addr.s_addr) == 0xc0000207 && res->ai_port_space == RDMA_PS_TCP &&
             res->ai_qp_type == IBV_QPT_RC && res->ai_next == NULL,
             "active: flags %#x, family %d, dst %p, port space %#x, qp type %d",
             res->ai_flags, res->ai_family, (void *)sa, res->ai_port_space, res->ai_qp_type);
        addr_str(res->ai_dst_addr, s3, sizeof(s3));
        rdma_freeaddrinfo(res);

        res = NULL;
        ret = rdma_getaddrinfo("not-an-address", "7612", &hints, &res);
        need(ret != 0 && res == NULL, "a name with RAI_NUMERICHOST returned %d", ret);
        rdma_freeaddrinfo(NULL);
        pass("passive %s (RDMA_PS_UDP, UD), wildcard %s (RDMA_PS_TCP, RC), active -> %s "
             "(RC); a name with RAI_NUMERICHOST fails (%d)", s1, s2, s3, ret);
    }

    begin("rdma_get_devices, rdma_free_devices");
    {
        int n = -1, nv = -1;
        struct ibv_device **vl = ibv_get_device_list(&nv);
        struct ibv_context **list = rdma_get_devices(&n);

        if (vl)
            ibv_free_device_list(vl);
        else
            nv = 0;  /* libibverbs found no RDMA subsystem at all */
        need(list != NULL && n == nv && list[n < 0 ? 0 : n] == NULL,
             "rdma_get_devices: list %p, %d devices; ibv_get_device_list: %d", (void *)list, n,
             nv);
        for (int i = 0; i < n; i++)
            need(list[i] != NULL, "rdma_get_devices: entry %d is NULL", i);
        rdma_free_devices(list);
        pass("a list of %d devices (as ibv_get_device_list), NULL-terminated, freed", n);
    }

    begin("rdma_event_str");
    {
#define EV(e) { e, #e }
        static const struct {
            enum rdma_cm_event_type e;
            const char *s;
        } evs[] = {
            EV(RDMA_CM_EVENT_ADDR_RESOLVED), EV(RDMA_CM_EVENT_ADDR_ERROR),
            EV(RDMA_CM_EVENT_ROUTE_RESOLVED), EV(RDMA_CM_EVENT_ROUTE_ERROR),
            EV(RDMA_CM_EVENT_CONNECT_REQUEST), EV(RDMA_CM_EVENT_CONNECT_RESPONSE),
            EV(RDMA_CM_EVENT_CONNECT_ERROR), EV(RDMA_CM_EVENT_UNREACHABLE),
            EV(RDMA_CM_EVENT_REJECTED), EV(RDMA_CM_EVENT_ESTABLISHED),
            EV(RDMA_CM_EVENT_DISCONNECTED), EV(RDMA_CM_EVENT_DEVICE_REMOVAL),
            EV(RDMA_CM_EVENT_MULTICAST_JOIN), EV(RDMA_CM_EVENT_MULTICAST_ERROR),
            EV(RDMA_CM_EVENT_ADDR_CHANGE), EV(RDMA_CM_EVENT_TIMEWAIT_EXIT),
        };
#undef EV
        size_t n = sizeof(evs) / sizeof(evs[0]);
        const char *s;

        for (size_t i = 0; i < n; i++) {
            s = rdma_event_str(evs[i].e);
            need(s && strcmp(s, evs[i].s) == 0, "event %d: \"%s\", wanted \"%s\"", evs[i].e,
                 s ? s : "(null)", evs[i].s);
        }
        s = rdma_event_str((enum rdma_cm_event_type)(RDMA_CM_EVENT_TIMEWAIT_EXIT + 1));
        need(s && strcmp(s, "UNKNOWN EVENT") == 0, "event %d: \"%s\"",
             RDMA_CM_EVENT_TIMEWAIT_EXIT + 1, s ? s : "(null)");
        s = rdma_event_str((enum rdma_cm_event_type)-1);
        need(s && strcmp(s, "UNKNOWN EVENT") == 0, "event -1: \"%s\"", s ? s : "(null)");
        pass("the %zu event types by name, %d and -1 \"UNKNOWN EVENT\"", n,
             RDMA_CM_EVENT_TIMEWAIT_EXIT + 1);
    }

    begin("multicast, ECE, rsockets: unsupported");
    {
        struct sockaddr_in mc = ip4("239.1.2.3", 0);
        struct rdma_cm_join_mc_attr_ex mca;
        struct ibv_ece ece;

        memset(&mca, 0, sizeof(mca));
        memset(&ece, 0, sizeof(ece));
        id = new_id(ch, NULL, RDMA_PS_UDP);
        want_errno(rdma_join_multicast(id, (struct sockaddr *)&mc, NULL), ENOSYS,
                   "rdma_join_multicast");
        mca.addr = (struct sockaddr *)&mc;
        want_errno(rdma_join_multicast_ex(id, &mca, NULL), ENOSYS, "rdma_join_multicast_ex");
        want_errno(rdma_leave_multicast(id, (struct sockaddr *)&mc), ENOSYS,
                   "rdma_leave_multicast");
        want_ok(rdma_destroy_id(id), "rdma_destroy_id");
        id = new_id(ch, NULL, RDMA_PS_TCP);
        want_errno(rdma_set_local_ece(id, &ece), EOPNOTSUPP, "rdma_set_local_ece");
        want_errno(rdma_get_remote_ece(id, &ece), EOPNOTSUPP, "rdma_get_remote_ece");
        want_errno(rdma_reject_ece(id, NULL, 0), EOPNOTSUPP, "rdma_reject_ece");
        want_ok(rdma_destroy_id(id), "rdma_destroy_id");
        want_errno(rsocket(AF_INET, SOCK_STREAM, 0), ENOSYS, "rsocket");
        want_errno(rpoll(NULL, 0, 0), ENOSYS, "rpoll");
        pass("rdma_join_multicast, _ex, rdma_leave_multicast -> ENOSYS; rdma_set_local_ece, "
             "rdma_get_remote_ece, rdma_reject_ece -> EOPNOTSUPP; rsocket, rpoll -> ENOSYS");
    }

    begin("rdma_set_option");
    {
        uint8_t tos = 32, t = 32;
        int one = 1;

        id = new_id(ch, NULL, RDMA_PS_TCP);
        want_errno(rdma_set_option(id, RDMA_OPTION_ID, RDMA_OPTION_ID_TOS, &tos, sizeof(tos)),
                   ENOSYS, "rdma_set_option (TOS)");
        want_ok(rdma_set_option(id, RDMA_OPTION_ID, RDMA_OPTION_ID_REUSEADDR, &one, sizeof(one)),
                "rdma_set_option (REUSEADDR)");
        want_ok(rdma_set_option(id, RDMA_OPTION_ID, RDMA_OPTION_ID_AFONLY, &one, sizeof(one)),
                "rdma_set_option (AFONLY)");
        want_errno(rdma_set_option(id, RDMA_OPTION_ID, RDMA_OPTION_ID_ACK_TIMEOUT, &t, sizeof(t)),
                   EINVAL, "rdma_set_option (ACK_TIMEOUT 32)");
        want_errno(rdma_set_option(id, RDMA_OPTION_ID, RDMA_OPTION_ID_REUSEADDR, &one, 1), EINVAL,
                   "rdma_set_option (REUSEADDR, 1 byte)");
        want_ok(rdma_destroy_id(id), "rdma_destroy_id");
        pass("TOS -> ENOSYS, REUSEADDR and AFONLY 1 -> 0, ACK_TIMEOUT 32 -> EINVAL, an int "
             "option of 1 byte -> EINVAL");
    }

    begin("calls in the wrong state");
    {
        struct rdma_conn_param cp;

        memset(&cp, 0, sizeof(cp));
        cp.qp_num = 0x99;
        id = new_id(ch, NULL, RDMA_PS_TCP);
        want_errno(rdma_connect(id, &cp), EINVAL, "rdma_connect (idle id)");
        want_errno(rdma_accept(id, &cp), EINVAL, "rdma_accept (idle id)");
        want_errno(rdma_reject(id, NULL, 0), EINVAL, "rdma_reject (idle id)");
        want_errno(rdma_establish(id), EINVAL, "rdma_establish (idle id)");
        want_errno(rdma_disconnect(id), EINVAL, "rdma_disconnect (idle id)");
        want_errno(rdma_resolve_route(id, 2000), EINVAL, "rdma_resolve_route (idle id)");
        want_ok(rdma_destroy_id(id), "rdma_destroy_id");
        want_errno(rdma_accept(l, &cp), EINVAL, "rdma_accept (listener)");
        want_errno(rdma_connect(l, &cp), EINVAL, "rdma_connect (listener)");
        want_errno(rdma_establish(l), EINVAL, "rdma_establish (listener)");
        pass("rdma_connect, rdma_accept, rdma_reject, rdma_establish, rdma_disconnect, "
             "rdma_resolve_route on an idle id -> EINVAL; rdma_accept, rdma_connect, "
             "rdma_establish on a listener -> EINVAL");
    }

    begin("rdma_migrate_id between two channels");
    {
        struct rdma_event_channel *a = rdma_create_event_channel();
        struct rdma_event_channel *b = rdma_create_event_channel();
        struct sockaddr_in dst = ip4("127.0.0.1", 7);
        int fl;

        need(a && b, "rdma_create_event_channel: %s", strerror(errno));
        id = new_id(a, (void *)0x2, RDMA_PS_TCP);
        want_ok(rdma_resolve_addr(id, NULL, (struct sockaddr *)&dst, 2000), "rdma_resolve_addr");
        need(readable(a->fd, 5000), "channel a: no event");
        want_ok(rdma_migrate_id(id, b), "rdma_migrate_id");
        need(id->channel == b, "id->channel is not the new channel");
        need(!readable(a->fd, 0), "the old channel's fd is still readable, its event gone");
        /* the queued event moved with the id */
        ev = next_event(b, 5000);
        need(ev->id == id && ev->event == RDMA_CM_EVENT_ADDR_ERROR,
             "channel b: %s for %s", rdma_event_str(ev->event), ev->id == id ? "the id" : "other");
        want_ok(rdma_ack_cm_event(ev), "rdma_ack_cm_event");
        fl = fcntl(a->fd, F_GETFL);
        need(fl >= 0 && fcntl(a->fd, F_SETFL, fl | O_NONBLOCK) == 0, "fcntl: %s", strerror(errno));
        want_errno(rdma_get_cm_event(a, &ev), EAGAIN, "rdma_get_cm_event (old channel)");
        /* new events follow the id */
        want_ok(rdma_destroy_id(id), "rdma_destroy_id");
        id = new_id(a, NULL, RDMA_PS_TCP);
        want_ok(rdma_migrate_id(id, b), "rdma_migrate_id (no event queued)");
        addr_error(b, id);
        want_errno(rdma_get_cm_event(a, &ev), EAGAIN, "rdma_get_cm_event (old channel)");
        want_ok(rdma_destroy_id(id), "rdma_destroy_id");
        /* an id destroyed with its event still queued: the channel is empty again */
        id = new_id(b, NULL, RDMA_PS_TCP);
        want_ok(rdma_resolve_addr(id, NULL, (struct sockaddr *)&dst, 2000), "rdma_resolve_addr");
        need(readable(b->fd, 5000), "channel b: no event");
        want_ok(rdma_destroy_id(id), "rdma_destroy_id (its event queued)");
        need(!readable(b->fd, 0), "the channel's fd is still readable, its only event gone");
        rdma_destroy_event_channel(a);
        rdma_destroy_event_channel(b);
        pass("a queued ADDR_ERROR moves with the id to the new channel, the old one has none "
             "(EAGAIN); the next event comes on the new channel");
    }

    begin("rdma_destroy_id of a listener, rdma_destroy_event_channel");
    {
        int fd;

        ch2 = rdma_create_event_channel();
        need(ch2 != NULL, "rdma_create_event_channel: %s", strerror(errno));
        id = new_id(ch2, NULL, RDMA_PS_TCP);
        listen_on(id, PORT_PEER);
        want_ok(rdma_destroy_id(id), "rdma_destroy_id (listener)");
        id = new_id(ch2, NULL, RDMA_PS_TCP);
        listen_on(id, PORT_PEER); /* the port is free again */
        want_ok(rdma_destroy_id(id), "rdma_destroy_id (listener)");
        fd = ch2->fd;
        rdma_destroy_event_channel(ch2);
        need(fcntl(fd, F_GETFD) == -1 && errno == EBADF, "the destroyed channel's fd %d is open",
             fd);
        pass("port %u listens again once its listener is destroyed; the destroyed channel's "
             "fd is closed", PORT_PEER);
    }

    /* fork() without exec: the child's inherited channel and ids are the parent's. */
    begin("fork(): the child's calls on the inherited channel and ids");
    {
        int pfd[2], st, n = 0;
        pid_t pid;

        need(pipe(pfd) == 0, "pipe: %s", strerror(errno));
        id = new_id(ch, NULL, RDMA_PS_TCP);
        fflush(stdout);
        pid = fork();
        need(pid >= 0, "fork: %s", strerror(errno));
        if (pid == 0) {
            struct rdma_event_channel *own;
            struct rdma_cm_id *cid;
            struct sockaddr_in any = ip4("0.0.0.0", PORT_LISTEN);

            close(pfd[0]);
            in_child = 1;
            what = "fork child";
            alarm(20); /* a call that blocks here fails the check (SIGALRM) */
            want_errno(rdma_get_cm_event(ch, &ev), EBADF, "rdma_get_cm_event (inherited channel)");
            want_errno(rdma_create_id(ch, &cid, NULL, RDMA_PS_TCP), EBADF,
                       "rdma_create_id (inherited channel)");
            /* gives up the child's copy alone: the parent's listener stays (below) */
            want_ok(rdma_destroy_id(l), "rdma_destroy_id (inherited listener)");
            want_ok(rdma_destroy_id(id), "rdma_destroy_id (inherited id)");
            /* a channel of the child's own: its own session, another client of ibcmd */
            own = rdma_create_event_channel();
            need(own != NULL, "rdma_create_event_channel (child): %s", strerror(errno));
            want_errno(rdma_get_cm_event(ch, &ev), EBADF,
                       "rdma_get_cm_event (inherited channel, child's own session)");
            want_errno(rdma_create_id(ch, &cid, NULL, RDMA_PS_TCP), EBADF,
                       "rdma_create_id (inherited channel, child's own session)");
            cid = new_id(own, NULL, RDMA_PS_TCP);
            want_ok(rdma_bind_addr(cid, (struct sockaddr *)&any), "rdma_bind_addr (child)");
            want_errno(rdma_listen(cid, 8), EADDRINUSE, "rdma_listen (child, parent's port)");
            want_ok(rdma_destroy_id(cid), "rdma_destroy_id (child)");
            rdma_destroy_event_channel(own);
            n = 1;
            if (write(pfd[1], &n, sizeof(n)) != sizeof(n))
                _exit(3);
            _exit(0);
        }
        close(pfd[1]);
        need(waitpid(pid, &st, 0) == pid, "waitpid: %s", strerror(errno));
        need(read(pfd[0], &n, sizeof(n)) == sizeof(n) && n == 1 && WIFEXITED(st) &&
             WEXITSTATUS(st) == 0, "the child failed (status %#x)", st);
        close(pfd[0]);
        pass("rdma_get_cm_event, rdma_create_id -> EBADF; rdma_destroy_id of the inherited "
             "listener and id -> 0; a channel of the child's own works and its listen on port "
             "%u -> EADDRINUSE (ibcmd refuses: the parent's listener is there)", PORT_LISTEN);

        begin("fork(): the parent after its child");
        addr_error(ch, id);
        want_ok(rdma_destroy_id(id), "rdma_destroy_id");
        id = new_id(ch, NULL, RDMA_PS_TCP);
        {
            struct sockaddr_in any = ip4("0.0.0.0", PORT_LISTEN);

            want_ok(rdma_bind_addr(id, (struct sockaddr *)&any), "rdma_bind_addr");
            want_errno(rdma_listen(id, 8), EADDRINUSE, "rdma_listen (the listener's port)");
        }
        want_ok(rdma_destroy_id(id), "rdma_destroy_id");
        want_ok(rdma_destroy_id(l), "rdma_destroy_id (listener)");
        id = new_id(ch, NULL, RDMA_PS_TCP);
        listen_on(id, PORT_LISTEN);
        want_ok(rdma_destroy_id(id), "rdma_destroy_id");
        pass("its inherited id's ADDR_ERROR comes on its channel, its listener still holds "
             "port %u until it destroys it", PORT_LISTEN);
    }

    begin("a synchronous id (no channel)");
    {
        struct sockaddr_in dst = ip4("127.0.0.1", 7);

        id = NULL;
        want_ok(rdma_create_id(NULL, &id, (void *)0x3, RDMA_PS_TCP), "rdma_create_id (NULL)");
        need(id && id->channel && id->channel != ch && id->context == (void *)0x3,
             "the synchronous id has no channel of its own");
        errno = 0;
        want_errno(rdma_resolve_addr(id, NULL, (struct sockaddr *)&dst, 2000), ENODEV,
                   "rdma_resolve_addr (synchronous)");
        need(id->event && id->event->event == RDMA_CM_EVENT_ADDR_ERROR &&
             id->event->status == -ENODEV, "id->event: %s",
             id->event ? rdma_event_str(id->event->event) : "none");
        want_ok(rdma_destroy_id(id), "rdma_destroy_id (synchronous)");
        pass("rdma_resolve_addr to 127.0.0.1 -> -1, ENODEV, id->event the ADDR_ERROR");
    }

    /* The passive side: REQs from a libibcm client through the other daemon. */
    begin("a peer's REQ: CONNECT_REQUEST");
    {
        static const char pd1[] = "rdmacm host test 1", rej[] = "no thanks";
        static const char pd2[] = "rdmacm host test 2";
        struct ibv_qp_attr qa;
        int mask = 0;
        uint8_t t = 14;
        char seen[256];
        pid_t peer;

        l = new_id(ch, (void *)0x4, RDMA_PS_TCP);
        listen_on(l, PORT_PEER);
        peer = spawn_peer(argv, PORT_PEER, PEER_QPN, pd1, rej);
        id = peer_request(ch, l, (void *)0x4, server_ip, PEER_QPN, pd1, seen, sizeof(seen));
        pass("RDMA_CM_EVENT_CONNECT_REQUEST on the listener's channel (listen_id the listener, "
             "a new id with its context) %s", seen);

        begin("rdma_init_qp_attr and ACK_TIMEOUT on a request");
        memset(&qa, 0, sizeof(qa));
        qa.qp_state = IBV_QPS_INIT;
        want_ok(rdma_init_qp_attr(id, &qa, &mask), "rdma_init_qp_attr (INIT)");
        need(qa.qp_state == IBV_QPS_INIT && (mask & IBV_QP_STATE) && (mask & IBV_QP_ACCESS_FLAGS),
             "INIT: state %d, mask %#x", qa.qp_state, mask);
        qa.qp_state = IBV_QPS_RTR;
        want_ok(rdma_init_qp_attr(id, &qa, &mask), "rdma_init_qp_attr (RTR)");
        need(qa.qp_state == IBV_QPS_RTR && (mask & IBV_QP_DEST_QPN) && qa.dest_qp_num == PEER_QPN,
             "RTR: state %d, mask %#x, dest_qp_num %#x", qa.qp_state, mask, qa.dest_qp_num);
        want_ok(rdma_set_option(id, RDMA_OPTION_ID, RDMA_OPTION_ID_ACK_TIMEOUT, &t, sizeof(t)),
                "rdma_set_option (ACK_TIMEOUT 14)");
        {
            uint8_t bad = 32;

            want_errno(rdma_set_option(id, RDMA_OPTION_ID, RDMA_OPTION_ID_ACK_TIMEOUT, &bad, 1),
                       EINVAL, "rdma_set_option (ACK_TIMEOUT 32: the refused value is not kept)");
        }
        qa.qp_state = IBV_QPS_RTS;
        want_ok(rdma_init_qp_attr(id, &qa, &mask), "rdma_init_qp_attr (RTS)");
        need(qa.qp_state == IBV_QPS_RTS && (mask & IBV_QP_TIMEOUT) && qa.timeout == 14,
             "RTS: state %d, mask %#x, timeout %u", qa.qp_state, mask, qa.timeout);
        want_errno(rdma_establish(id), EINVAL, "rdma_establish (passive)");
        pass("INIT, RTR (dest_qp_num the peer's %#x), RTS with the ACK_TIMEOUT set (14); "
             "rdma_establish on it -> EINVAL", PEER_QPN);

        begin("rdma_reject of a request");
        want_ok(rdma_reject(id, rej, (uint8_t)strlen(rej)), "rdma_reject");
        peer_done(peer);
        want_errno(rdma_reject(id, NULL, 0), EINVAL, "rdma_reject (a second time)");
        want_ok(rdma_destroy_id(id), "rdma_destroy_id");
        pass("the peer got REJECTED, reason 28, with the private data \"%s\"; a second "
             "rdma_reject -> EINVAL", rej);

        begin("rdma_destroy_id of an unanswered request");
        peer = spawn_peer(argv, PORT_PEER, PEER_QPN + 1, pd2, "");
        id = peer_request(ch, l, (void *)0x4, server_ip, PEER_QPN + 1, pd2, seen, sizeof(seen));
        {
            struct rdma_conn_param cp;

            memset(&cp, 0, sizeof(cp));
            cp.qp_num = 0x99;
            want_errno(rdma_accept(id, &cp), ENODEV, "rdma_accept (no device for the request)");
        }
        want_ok(rdma_destroy_id(id), "rdma_destroy_id (unanswered request)");
        peer_done(peer);
        want_ok(rdma_destroy_id(l), "rdma_destroy_id (listener)");
        {
            int fl = fcntl(ch->fd, F_GETFL);

            need(fl >= 0 && fcntl(ch->fd, F_SETFL, fl | O_NONBLOCK) == 0, "fcntl: %s",
                 strerror(errno));
            want_errno(rdma_get_cm_event(ch, &ev), EAGAIN, "rdma_get_cm_event (nothing left)");
        }
        pass("a second REQ (%s) answered by the destroy: the peer got REJECTED, reason 28, no "
             "private data; no event left on the channel", seen);
    }

    rdma_destroy_event_channel(ch);
    printf("rdmacm: %d checks passed\n", checks);
    return 0;
}
