/*
 * gone.c -- a daemon killed under a C runtime, and restarted.
 *
 *   gone SERVER_SOCKET CLIENT_SOCKET SERVER_IP QPN_BASE
 *
 * Establishes one RC connection from the client context (client node's daemon) to the
 * server context (server node's daemon), prints "ready", and then expects, while
 * tests/c-abi/run SIGKILLs the server node's daemon and starts it again:
 *
 *   server context  the connection's final event with IBCM_EGONE, and
 *                   IBCM_EVENT_SERVICE_GONE (the daemon is gone); calls then fail IBCM_EGONE;
 *   client context  DISCONNECTED by the peer: the restarted daemon found the connection in
 *                   its journal and sent the DREQ its previous life could not;
 *   a third context (server socket, no connection) with two threads blocked in
 *                   ibcm_wait_event(-1) when the daemon dies: one takes SERVICE_GONE, the
 *                   other returns IBCM_EGONE, and every later wait (-1 or 1,000 ms) returns
 *                   IBCM_EGONE at once (issue 26 §1.1: it blocked for ever, or gave
 *                   IBCM_EAGAIN after the full timeout);
 *   after SERVICE_GONE, every call on the server context fails with IBCM_EGONE at once:
 *                   ibcm_get_event, ibcm_wait_event (-1 and 1,000 ms), ibcm_connect (it
 *                   returned OK and then CONNECT_ERROR), ibcm_disconnect, ibcm_listen.
 *
 * Prints "torn down: ..." for the connection once both are seen; anything else fails.
 */
#include "example.h"

#include <errno.h>
#include <pthread.h>
#include <signal.h>
#include <time.h>
#include <unistd.h>

#define SID 0x10000000c0de0004ULL

/* The third context and what its two waiting threads saw. */
static struct ibcm_ctx *watch;
struct waiter {
    pthread_t t;
    int got_gone_event; /* took IBCM_EVENT_SERVICE_GONE */
    int first;          /* the status of the wait that was blocked when the daemon died */
    int again_forever;  /* a wait(-1) after that */
    int again_timed;    /* a wait(1000 ms) after that */
    double timed_ms;    /* how long that one took */
};

static double now_ms(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return ts.tv_sec * 1e3 + ts.tv_nsec / 1e6;
}

static void *wait_thread(void *arg)
{
    struct waiter *w = arg;
    struct ibcm_event *ev;
    int rc = ibcm_wait_event(watch, -1, &ev);
    if (rc == IBCM_OK) {
        if (ev->event == IBCM_EVENT_SERVICE_GONE)
            w->got_gone_event = 1;
        ibcm_ack_event(watch, ev);
        rc = ibcm_wait_event(watch, -1, &ev); /* nothing more comes */
    }
    w->first = rc;
    w->again_forever = ibcm_wait_event(watch, -1, &ev);
    double t0 = now_ms();
    w->again_timed = ibcm_wait_event(watch, 1000, &ev);
    w->timed_ms = now_ms() - t0;
    return NULL;
}

static void on_alarm(int sig)
{
    (void)sig;
    static const char m[] = "FAIL: a call on the dead daemon's context still blocks 10 s on\n";
    if (write(2, m, sizeof m - 1) < 0) {
    }
    _exit(1);
}

/* A call on the server context after SERVICE_GONE: IBCM_EGONE. */
static void want_gone(int rc, const char *what)
{
    if (rc != IBCM_EGONE) {
        fprintf(stderr, "FAIL: %s after SERVICE_GONE: %s (%d), wanted IBCM_EGONE\n", what,
                ibcm_strerror(rc), rc);
        exit(1);
    }
    printf("checked: %s after SERVICE_GONE -> %s\n", what, ibcm_strerror(rc));
}

int main(int argc, char **argv)
{
    if (argc != 5) {
        fprintf(stderr, "usage: gone SERVER_SOCKET CLIENT_SOCKET SERVER_IP QPN_BASE\n");
        return 2;
    }
    uint32_t base = (uint32_t)strtoul(argv[4], NULL, 0);
    /* tests/c-abi/run acts on these lines as they come. */
    setvbuf(stdout, NULL, _IOLBF, 0);
    struct ibcm_ctx *ctx[2];
    check(ibcm_open(argv[1], &ctx[0]), "ibcm_open (server)");
    check(ibcm_open(argv[2], &ctx[1]), "ibcm_open (client)");
    check(ibcm_listen(ctx[0], SID), "ibcm_listen");
    check(ibcm_open(argv[1], &watch), "ibcm_open (watcher)");
    struct waiter w[2];
    memset(w, 0, sizeof w);
    for (int i = 0; i < 2; i++)
        if (pthread_create(&w[i].t, NULL, wait_thread, &w[i]) != 0)
            fail("%s", "pthread_create");

    struct ibcm_conn_param p;
    uint64_t h, srv = 0;
    check(ibcm_conn_param_init(&p), "ibcm_conn_param_init");
    p.peer = argv[3];
    p.service_id = SID;
    p.qp_num = base;
    check(ibcm_connect(ctx[1], &p, &h), "ibcm_connect");

    int up = 0, srv_final = 0, srv_gone = 0, cli_final = 0;
    while (!(srv_final && srv_gone && cli_final)) {
        int which;
        /* Once SERVICE_GONE and the connection's end are taken, the server context has no
         * more events (its calls fail IBCM_EGONE): only the client context is polled. */
        int srv_done = srv_gone && srv_final;
        struct ibcm_event *ev = next_event(ctx + srv_done, 2 - srv_done, 60000, &which);
        which += srv_done;
        int type = ev->event;
        if (which == 0 && type == IBCM_EVENT_CONNECT_REQUEST) {
            struct ibcm_accept_param ap;
            check(ibcm_accept_param_init(ctx[0], &ap), "ibcm_accept_param_init");
            ap.qp_num = base + 1;
            srv = ev->conn;
            check(ibcm_accept(ctx[0], srv, &ap), "ibcm_accept");
        } else if (type == IBCM_EVENT_ESTABLISHED) {
            if (++up == 2) {
                printf("established: gone conn 0 comm_id %#x\nready\n", ev->comm_id);
            }
        } else if (which == 0 && type == IBCM_EVENT_SERVICE_GONE) {
            printf("checked: server context: SERVICE_GONE: %s\n", ev->reason);
            srv_gone = 1;
        } else if (which == 0 && is_final(ev) && ev->conn == srv && up == 2) {
            if (ev->status != IBCM_EGONE)
                fail("server connection ended otherwise: %s", ev->reason);
            printf("checked: server connection ended: %s: %s\n", ibcm_event_str(type), ev->reason);
            srv_final = 1;
        } else if (which == 1 && type == IBCM_EVENT_DISCONNECTED && ev->conn == h && srv_final) {
            if (!ev->by_peer)
                fail("%s", "the client's connection did not end by the peer's DREQ");
            printf("checked: client connection: DREQ from the restarted daemon: %s\n",
                   ev->reason);
            cli_final = 1;
        } else {
            fprintf(stderr, "context %d: %s: %s\n", which, ibcm_event_str(type), ev->reason);
            fail("unexpected event %s", ibcm_event_str(type));
        }
        check(ibcm_ack_event(ctx[which], ev), "ibcm_ack_event");
    }
    signal(SIGALRM, on_alarm);
    alarm(10);
    /* The watcher's two threads, blocked when the daemon died. */
    for (int i = 0; i < 2; i++)
        pthread_join(w[i].t, NULL);
    if (w[0].got_gone_event + w[1].got_gone_event != 1)
        fail("%s", "SERVICE_GONE was not taken by exactly one waiting thread");
    for (int i = 0; i < 2; i++) {
        if (w[i].first != IBCM_EGONE || w[i].again_forever != IBCM_EGONE ||
            w[i].again_timed != IBCM_EGONE || w[i].timed_ms > 500) {
            fprintf(stderr, "FAIL: waiting thread %d after SERVICE_GONE: %s, %s, %s after %.0f ms\n",
                    i, ibcm_strerror(w[i].first), ibcm_strerror(w[i].again_forever),
                    ibcm_strerror(w[i].again_timed), w[i].timed_ms);
            exit(1);
        }
    }
    printf("checked: two threads blocked in ibcm_wait_event(-1) when the daemon died: "
           "SERVICE_GONE for one, IBCM_EGONE for the other, and at once for every later wait\n");
    check(ibcm_close(watch), "ibcm_close (watcher)");

    struct ibcm_event *ev;
    want_gone(ibcm_get_event(ctx[0], &ev), "ibcm_get_event");
    want_gone(ibcm_wait_event(ctx[0], -1, &ev), "ibcm_wait_event(-1)");
    double t0 = now_ms();
    want_gone(ibcm_wait_event(ctx[0], 1000, &ev), "ibcm_wait_event(1000 ms)");
    if (now_ms() - t0 > 500)
        fail("%s", "ibcm_wait_event(1000 ms) waited its timeout out");
    uint64_t h2;
    p.qp_num = base + 2;
    want_gone(ibcm_connect(ctx[0], &p, &h2), "ibcm_connect");
    want_gone(ibcm_disconnect(ctx[0], srv, NULL, 0), "ibcm_disconnect");
    want_gone(ibcm_listen(ctx[0], SID + 1), "ibcm_listen");
    alarm(0);
    printf("torn down: gone conn 0 (killed daemon, DREQ after its restart)\n");
    check(ibcm_close(ctx[1]), "ibcm_close (client)");
    check(ibcm_close(ctx[0]), "ibcm_close (server)");
    return 0;
}
