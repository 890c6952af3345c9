/*
 * ib_listen.c -- the passive side of ib_connect: accepts COUNT connections on a service ID
 * through one ibcmd (on a native InfiniBand port, or any other) with libibcm.
 *
 *   ib_listen [--accept-laps] SOCKET SERVICE_ID COUNT [QPN_BASE]
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
 *
 * With --accept-laps (the passive side of ib_apm) it answers its connections' LAPs itself
 * (ibcm_lap_policy IBCM_LAP_APPLICATION): each proposed path is loaded (its alternate path
 * attributes, ibcm_init_alt_path_attr for an InfiniBand port, must name the proposing port
 * as the DLID; else the LAP is rejected, APR status 7 "invalid LID") and accepted (APR status
 * 0). The REQs that carried an alternate path are counted too; the last line is then
 *
 *   ib_listen: N established, N disconnected, N alternate paths, N LAPs loaded
 *
 * and it exits 0 if the established, disconnected and LAP counts are COUNT ("alternate
 * paths" is COUNT when the initiator asked for them on a fabric with LMC > 0, ib_apm to a
 * gid: or lid: target; 0 over IP).
 */
#include "example.h"

#include <inttypes.h>

int main(int argc, char **argv)
{
    int accept_laps = argc > 1 && strcmp(argv[1], "--accept-laps") == 0;
    if (accept_laps) {
        argv++;
        argc--;
    }
    if (argc != 4 && argc != 5) {
        fprintf(stderr, "usage: ib_listen [--accept-laps] SOCKET SERVICE_ID COUNT [QPN_BASE]\n");
        return 2;
    }
    uint64_t sid = strtoull(argv[2], NULL, 0);
    long count = strtol(argv[3], NULL, 0);
    long qpn_base = argc == 5 ? strtol(argv[4], NULL, 0) : 0x2000;
    if (count < 1 || count > 100000)
        fail("%s", "COUNT must be 1..100000");
    if (qpn_base < 1 || qpn_base + count > 0xffffff)
        fail("%s", "QPN_BASE + COUNT must stay below 0xffffff");

    /* The daemon's InfiniBand port, for the alternate path's attributes. */
    const struct ibcm_port port = {
        .port_num = 1, .sgid_index = 0, .lmc = 0, .pkey_index = 0,
        .link_layer = IBCM_LINK_LAYER_INFINIBAND,
    };

    struct ibcm_ctx *ctx;
    check(ibcm_open(argv[1], &ctx), "ibcm_open");
    if (accept_laps)
        check(ibcm_lap_policy(ctx, IBCM_LAP_APPLICATION), "ibcm_lap_policy");
    check(ibcm_listen(ctx, sid), "ibcm_listen");
    printf("ib_listen: listening on service %#" PRIx64 " (%s)\n", sid, argv[1]);
    fflush(stdout);

    long requests = 0, established = 0, disconnected = 0, failed = 0, alternates = 0, laps = 0;
    while (disconnected + failed < count) {
        int which;
        struct ibcm_event *ev = next_event(&ctx, 1, requests == 0 ? 120000 : 30000, &which);
        switch (ev->event) {
        case IBCM_EVENT_CONNECT_REQUEST: {
            if (requests == 0)
                printf("ib_listen: first request from %s (service %#" PRIx64 ", qpn %#x)\n",
                       ev->peer, ev->service_id, ev->remote_qpn);
            struct ibcm_path alt;
            if (ibcm_query_path(ctx, ev->conn, IBCM_PATH_ALTERNATE, &alt) == IBCM_OK)
                alternates++;
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
        case IBCM_EVENT_LAP: {
            /* Load the proposed path into the QP (here: its attributes), then accept. */
            struct ibcm_qp_attr a;
            int mask;
            check(ibcm_init_alt_path_attr(ctx, ev->conn, &port, &a, &mask), "alt path attr");
            if (a.alt_ah_attr.dlid != ev->path->remote_lid) {
                printf("ib_listen: connection %" PRIu64 ": LAP to DLID %u, not the peer's "
                       "LID %u: rejected\n", ev->conn, a.alt_ah_attr.dlid, ev->path->remote_lid);
                check(ibcm_lap_reject(ctx, ev->conn, 7, NULL, 0, NULL, 0), "ibcm_lap_reject");
                break;
            }
            check(ibcm_lap_accept(ctx, ev->conn, NULL, 0), "ibcm_lap_accept");
            laps++;
            break;
        }
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
    if (!accept_laps) {
        printf("ib_listen: %ld established, %ld disconnected\n", established, disconnected);
        return established == count && disconnected == count ? 0 : 1;
    }
    printf("ib_listen: %ld established, %ld disconnected, %ld alternate paths, %ld LAPs loaded\n",
           established, disconnected, alternates, laps);
    return established == count && disconnected == count && laps == count ? 0 : 1;
}
