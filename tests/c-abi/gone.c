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
 *                   its journal and sent the DREQ its previous life could not.
 *
 * Prints "torn down: ..." for the connection once both are seen; anything else fails.
 */
#include "example.h"

#define SID 0x10000000c0de0004ULL

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
        struct ibcm_event *ev = next_event(ctx, 2, 60000, &which);
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
    int rc = ibcm_listen(ctx[0], SID + 1);
    if (rc != IBCM_EGONE)
        fail("a call after the daemon's death did not fail with IBCM_EGONE: %s", ibcm_strerror(rc));
    printf("checked: a call on the dead daemon's context -> %s\n", ibcm_strerror(rc));
    printf("torn down: gone conn 0 (killed daemon, DREQ after its restart)\n");
    check(ibcm_close(ctx[1]), "ibcm_close (client)");
    check(ibcm_close(ctx[0]), "ibcm_close (server)");
    return 0;
}
