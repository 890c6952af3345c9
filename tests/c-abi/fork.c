/*
 * fork.c -- fork() without exec under an established connection (issue 26 §1.4).
 *
 *   fork SERVER_SOCKET CLIENT_SOCKET SERVER_IP QPN_BASE
 *
 * This process (the server) forks a worker before touching libibcm. The worker opens a
 * context on the client node's daemon and connects to the server; once established it
 * forks a child that never execs and lives on (pause), and a second child that only closes
 * the inherited context and exits. The server then SIGKILLs the worker and checks:
 *
 *   - the worker's connection ends at the server (DISCONNECTED by the peer) while the
 *     forked child still lives: a child does not hold its parent's session (it did: the
 *     DREQ came only once the child was gone);
 *   - in the child, calls on the inherited context fail with IBCM_EGONE (ibcm_get_event,
 *     ibcm_connect), ibcm_close of it returns IBCM_OK (it frees nothing there), and a
 *     context of the child's own (ibcm_open) works.
 *
 * Prints the latency from the SIGKILL to the server's DISCONNECTED, "torn down: ..." for
 * the connection, and exits 1 on any failed check.
 */
#include "example.h"

#include <errno.h>
#include <signal.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#define SID 0x10000000c0de0006ULL

static double now_ms(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return ts.tv_sec * 1e3 + ts.tv_nsec / 1e6;
}

/* One line to the server over the report pipe. */
static void report(int fd, const char *line)
{
    char buf[256];
    int n = snprintf(buf, sizeof buf, "%s\n", line);
    if (write(fd, buf, (size_t)n) != n)
        _exit(3);
}

static void child_checks(struct ibcm_ctx *inherited, const char *sock, int out)
{
    char line[200];
    struct ibcm_event *ev;
    int rc = ibcm_get_event(inherited, &ev);
    snprintf(line, sizeof line, "%s child: ibcm_get_event on the inherited context -> %s",
             rc == IBCM_EGONE ? "checked:" : "FAIL:", ibcm_strerror(rc));
    report(out, line);
    struct ibcm_conn_param p;
    uint64_t h;
    ibcm_conn_param_init(&p);
    p.peer = "127.0.0.1";
    p.service_id = SID;
    p.qp_num = 0x77;
    rc = ibcm_connect(inherited, &p, &h);
    snprintf(line, sizeof line, "%s child: ibcm_connect on the inherited context -> %s",
             rc == IBCM_EGONE ? "checked:" : "FAIL:", ibcm_strerror(rc));
    report(out, line);
    struct ibcm_ctx *own;
    rc = ibcm_open(sock, &own);
    if (rc == IBCM_OK)
        rc = ibcm_close(own);
    snprintf(line, sizeof line, "%s child: a context of its own (ibcm_open, ibcm_close) -> %s",
             rc == IBCM_OK ? "checked:" : "FAIL:", ibcm_strerror(rc));
    report(out, line);
}

/* The worker: connects, forks its children, reports, waits to be killed. */
static void worker(const char *sock, const char *ip, uint32_t qpn, int go, int out)
{
    char c;
    if (read(go, &c, 1) != 1)
        _exit(3);
    struct ibcm_ctx *ctx;
    check(ibcm_open(sock, &ctx), "ibcm_open (worker)");
    struct ibcm_conn_param p;
    uint64_t h;
    check(ibcm_conn_param_init(&p), "ibcm_conn_param_init");
    p.peer = ip;
    p.service_id = SID;
    p.qp_num = qpn;
    check(ibcm_connect(ctx, &p, &h), "ibcm_connect (worker)");
    struct ibcm_event *ev;
    check(ibcm_wait_event(ctx, 30000, &ev), "ibcm_wait_event (worker)");
    if (ev->event != IBCM_EVENT_ESTABLISHED)
        fail("worker: %s", ev->reason);
    check(ibcm_ack_event(ctx, ev), "ibcm_ack_event (worker)");

    /* A child that only closes the inherited context. */
    pid_t closer = fork();
    if (closer == 0)
        _exit(ibcm_close(ctx) == IBCM_OK ? 0 : 1);
    int st = 0;
    waitpid(closer, &st, 0);
    report(out, WIFEXITED(st) && WEXITSTATUS(st) == 0
                    ? "checked: child: ibcm_close of the inherited context -> IBCM_OK"
                    : "FAIL: child: ibcm_close of the inherited context failed");

    /* A child that lives on, never execs. */
    pid_t child = fork();
    if (child == 0) {
        child_checks(ctx, sock, out);
        report(out, "child ready");
        for (;;)
            pause();
    }
    char line[64];
    snprintf(line, sizeof line, "child %d", (int)child);
    report(out, line);
    for (;;)
        pause();
}

int main(int argc, char **argv)
{
    if (argc != 5) {
        fprintf(stderr, "usage: fork SERVER_SOCKET CLIENT_SOCKET SERVER_IP QPN_BASE\n");
        return 2;
    }
    uint32_t base = (uint32_t)strtoul(argv[4], NULL, 0);
    setvbuf(stdout, NULL, _IOLBF, 0);
    int go[2], rep[2];
    if (pipe(go) != 0 || pipe(rep) != 0)
        fail("%s", "pipe");
    pid_t w = fork();
    if (w == 0) {
        close(go[1]);
        close(rep[0]);
        worker(argv[2], argv[3], base, go[0], rep[1]);
    }
    close(go[0]);
    close(rep[1]);

    struct ibcm_ctx *ctx;
    check(ibcm_open(argv[1], &ctx), "ibcm_open (server)");
    check(ibcm_listen(ctx, SID), "ibcm_listen");
    if (write(go[1], "g", 1) != 1)
        fail("%s", "write");
    uint64_t srv = 0;
    for (int up = 0; !up;) {
        struct ibcm_event *ev;
        check(ibcm_wait_event(ctx, 30000, &ev), "ibcm_wait_event (server)");
        if (ev->event == IBCM_EVENT_CONNECT_REQUEST) {
            struct ibcm_accept_param ap;
            check(ibcm_accept_param_init(ctx, &ap), "ibcm_accept_param_init");
            ap.qp_num = base + 1;
            srv = ev->conn;
            check(ibcm_accept(ctx, srv, &ap), "ibcm_accept");
        } else if (ev->event == IBCM_EVENT_ESTABLISHED && ev->conn == srv) {
            up = 1;
        } else {
            fail("server: unexpected %s", ibcm_event_str(ev->event));
        }
        check(ibcm_ack_event(ctx, ev), "ibcm_ack_event");
    }
    printf("established: fork conn 0 (the worker's)\n");

    /* The worker's and its children's reports, until the long-lived child is ready. */
    FILE *in = fdopen(rep[0], "r");
    char line[256];
    int child = 0, failed = 0, ready = 0;
    while (!ready && fgets(line, sizeof line, in)) {
        if (sscanf(line, "child %d", &child) == 1)
            continue;
        if (strcmp(line, "child ready\n") == 0) {
            ready = 1;
            continue;
        }
        fputs(line, stdout);
        failed |= strncmp(line, "FAIL", 4) == 0;
    }
    if (!ready || child <= 0)
        fail("%s", "the worker's child did not report");

    double t0 = now_ms();
    kill(w, SIGKILL);
    waitpid(w, NULL, 0);
    struct ibcm_event *ev;
    int rc = ibcm_wait_event(ctx, 10000, &ev);
    double ms = now_ms() - t0;
    int child_alive = kill(child, 0) == 0;
    if (rc == IBCM_OK && ev->event == IBCM_EVENT_DISCONNECTED && ev->conn == srv &&
        ev->by_peer && child_alive) {
        printf("checked: DISCONNECTED %.1f ms after the worker's SIGKILL, while its forked "
               "child still lives\n", ms);
        check(ibcm_ack_event(ctx, ev), "ibcm_ack_event");
        kill(child, SIGKILL);
        waitpid(child, NULL, 0);
    } else {
        printf("FAIL: no DISCONNECTED within %.0f ms of the worker's SIGKILL while its forked "
               "child lives (%s)\n", ms, rc == IBCM_OK ? ibcm_event_str(ev->event) : ibcm_strerror(rc));
        if (rc == IBCM_OK)
            ibcm_ack_event(ctx, ev);
        kill(child, SIGKILL);
        waitpid(child, NULL, 0);
        t0 = now_ms();
        rc = ibcm_wait_event(ctx, 30000, &ev);
        if (rc == IBCM_OK) {
            printf("       the %s came %.1f ms after the child was killed\n",
                   ibcm_event_str(ev->event), now_ms() - t0);
            ibcm_ack_event(ctx, ev);
        }
        failed = 1;
    }
    check(ibcm_close(ctx), "ibcm_close (server)");
    if (failed)
        return 1;
    printf("torn down: fork conn 0 (the worker killed, its forked child alive)\n");
    return 0;
}
