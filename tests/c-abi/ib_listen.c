/*
 * ib_listen.c -- the passive side of ib_connect: accepts COUNT connections on a service ID
 * through one ibcmd (on a native InfiniBand port, or any other) with libibcm.
 *
 *   ib_listen SOCKET SERVICE_ID COUNT [QPN_BASE]
 *
 * Attaches to the daemon at SOCKET, listens on SERVICE_ID (decimal, or hex with 0x), prints
 * "ib_listen: listening on service 0x... (SOCKET)" once the daemon has the listener, and
 * accepts every REQ (its QPN QPN_BASE + i, default 0x2000 + i: a QPN is quarantined while
 * its last connection is in TimeWait). The peer of the first REQ is printed as the event
 * names it ("lid:N" for a LID-routed REQ, "gid:G" with a GRH, "IP:PORT" on RoCE). When COUNT
 * connections have been established and disconnected by the peer (or the first event takes
 * 120 s, a later one 30 s), it prints
 *
 *   ib_listen: N established, N disconnected
 *
 * and exits 0 if both are COUNT, 1 otherwise (each failure also prints a line of its own).
 */
#include "example.h"

#include <inttypes.h>

int main(int argc, char **argv)
{
    if (argc != 4 && argc != 5) {
        fprintf(stderr, "usage: ib_listen SOCKET SERVICE_ID COUNT [QPN_BASE]\n");
        return 2;
    }
    uint64_t sid = strtoull(argv[2], NULL, 0);
    long count = strtol(argv[3], NULL, 0);
    long qpn_base = argc == 5 ? strtol(argv[4], NULL, 0) : 0x2000;
    if (count < 1 || count > 100000)
        fail("%s", "COUNT must be 1..100000");
    if (qpn_base < 1 || qpn_base + count > 0xffffff)
        fail("%s", "QPN_BASE + COUNT must stay below 0xffffff");

    struct ibcm_ctx *ctx;
    check(ibcm_open(argv[1], &ctx), "ibcm_open");
    check(ibcm_listen(ctx, sid), "ibcm_listen");
    printf("ib_listen: listening on service %#" PRIx64 " (%s)\n", sid, argv[1]);
    fflush(stdout);

    long requests = 0, established = 0, disconnected = 0, failed = 0;
    while (disconnected + failed < count) {
        int which;
        struct ibcm_event *ev = next_event(&ctx, 1, requests == 0 ? 120000 : 30000, &which);
        switch (ev->event) {
        case IBCM_EVENT_CONNECT_REQUEST: {
            if (requests == 0)
                printf("ib_listen: first request from %s (service %#" PRIx64 ", qpn %#x)\n",
                       ev->peer, ev->service_id, ev->remote_qpn);
            struct ibcm_accept_param ap;
            check(ibcm_accept_param_init(ctx, &ap), "ibcm_accept_param_init");
            ap.qp_num = (uint32_t)(qpn_base + requests);
            requests++;
            check(ibcm_accept(ctx, ev->conn, &ap), "ibcm_accept");
            break;
        }
        case IBCM_EVENT_ESTABLISHED:
            established++;
            break;
        case IBCM_EVENT_DISCONNECTED:
            if (ev->by_peer) {
                disconnected++;
            } else {
                printf("ib_listen: connection %" PRIu64 " ended here: %s\n", ev->conn,
                       ev->reason);
                failed++;
            }
            break;
        case IBCM_EVENT_SERVICE_GONE:
            fail("the node service is gone: %s", ev->reason);
            break;
        default:
            printf("ib_listen: connection %" PRIu64 ": %s: %s (%s)\n", ev->conn,
                   ibcm_event_str(ev->event), ibcm_strerror(ev->status), ev->reason);
            if (is_final(ev))
                failed++;
        }
        check(ibcm_ack_event(ctx, ev), "ibcm_ack_event");
    }
    check(ibcm_unlisten(ctx, sid), "ibcm_unlisten");
    check(ibcm_close(ctx), "ibcm_close");
    printf("ib_listen: %ld established, %ld disconnected\n", established, disconnected);
    return established == count && disconnected == count ? 0 : 1;
}
