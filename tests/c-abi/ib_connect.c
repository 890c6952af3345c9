/*
 * ib_connect.c -- COUNT connections in a row to a peer named by LID or GID, through one
 * ibcmd on a native InfiniBand port, with libibcm.
 *
 *   ib_connect SOCKET TARGET SERVICE_ID COUNT [QPN_BASE]
 *
 * TARGET is what ibcm_conn_param.peer takes: "lid:N" (decimal or 0x hex) or "gid:G" (IPv6
 * notation), for which the daemon asks its SA for the path before each REQ (an IP peer works
 * too, through a daemon on RoCE or UDP). SERVICE_ID is the passive side's (ib_listen's),
 * decimal or 0x hex. Each connection, one after the other, from QPN QPN_BASE + i (default
 * 0x1000 + i): the REQ, the REP (IBCM_CONNECT_MANUAL_RTU: the RTR and RTS attributes are
 * asked for an InfiniBand port, and the first connection's path is printed: DLID, SL, MTU,
 * whether a GRH is needed), the RTU (ibcm_establish), then ibcm_disconnect and the DREP.
 * A connection that fails prints why (its final event, status and reason: a path the daemon
 * could not get is CONNECT_ERROR with IBCM_ENOPATH) and the next one is tried. Last:
 *
 *   ib_connect: N established, N disconnected
 *
 * and exit 0 if both are COUNT, 1 otherwise.
 */
#include "example.h"

#include <inttypes.h>
#include <time.h>

int main(int argc, char **argv)
{
    if (argc != 5 && argc != 6) {
        fprintf(stderr, "usage: ib_connect SOCKET TARGET SERVICE_ID COUNT [QPN_BASE]\n");
        return 2;
    }
    const char *target = argv[2];
    uint64_t sid = strtoull(argv[3], NULL, 0);
    long count = strtol(argv[4], NULL, 0);
    long qpn_base = argc == 6 ? strtol(argv[5], NULL, 0) : 0x1000;
    if (count < 1 || count > 100000)
        fail("%s", "COUNT must be 1..100000");
    if (qpn_base < 1 || qpn_base + count > 0xffffff)
        fail("%s", "QPN_BASE + COUNT must stay below 0xffffff");
    int ib = strncmp(target, "lid:", 4) == 0 || strncmp(target, "gid:", 4) == 0;
    /* The daemon's InfiniBand port, for the QP attributes (P_Key index 0: the path is in
     * the port's P_Key 0, which the daemon checked). */
    const struct ibcm_port port = {
        .port_num = 1, .sgid_index = 0, .lmc = 0, .pkey_index = 0,
        .link_layer = IBCM_LINK_LAYER_INFINIBAND,
    };

    struct ibcm_ctx *ctx;
    check(ibcm_open(argv[1], &ctx), "ibcm_open");
    long established = 0, disconnected = 0;
    struct timespec t0, t1;
    clock_gettime(CLOCK_MONOTONIC, &t0);
    for (long i = 0; i < count; i++) {
        struct ibcm_conn_param p;
        uint64_t h;
        char pd[32];
        check(ibcm_conn_param_init(&p), "ibcm_conn_param_init");
        p.peer = target;
        p.service_id = sid;
        p.qp_num = (uint32_t)(qpn_base + i);
        p.flags = IBCM_CONNECT_MANUAL_RTU;
        snprintf(pd, sizeof pd, "ib_connect %ld", i);
        p.private_data = (const uint8_t *)pd;
        p.private_data_len = (uint32_t)strlen(pd);
        check(ibcm_connect(ctx, &p, &h), "ibcm_connect");
        /* This connection's events, to its final one. */
        for (int done = 0; !done;) {
            int which;
            struct ibcm_event *ev = next_event(&ctx, 1, 60000, &which);
            if (ev->event == IBCM_EVENT_SERVICE_GONE)
                fail("the node service is gone: %s", ev->reason);
            if (ev->conn != h)
                fail("%s", "an event of another connection");
            switch (ev->event) {
            case IBCM_EVENT_CONNECT_RESPONSE: {
                struct ibcm_qp_attr a;
                int mask;
                const struct ibcm_port *pp = ib ? &port : NULL;
                check(ibcm_init_qp_attr(ctx, h, IBCM_QPS_RTR, pp, NULL, &a, &mask), "RTR attr");
                if (i == 0)
                    printf("ib_connect: path to %s: dlid %u sl %u mtu %u grh %u "
                           "(remote qpn %#x)\n",
                           target, a.ah_attr.dlid, a.ah_attr.sl, a.path_mtu,
                           a.ah_attr.is_global, ev->remote_qpn);
                if (ib && a.ah_attr.dlid == 0)
                    fail("%s", "an InfiniBand path without a DLID");
                check(ibcm_init_qp_attr(ctx, h, IBCM_QPS_RTS, pp, NULL, &a, &mask), "RTS attr");
                check(ibcm_establish(ctx, h, NULL, 0), "ibcm_establish");
                break;
            }
            case IBCM_EVENT_ESTABLISHED:
                established++;
                check(ibcm_disconnect(ctx, h, NULL, 0), "ibcm_disconnect");
                break;
            case IBCM_EVENT_DISCONNECTED:
                if (ev->by_peer)
                    printf("ib_connect: connection %ld: disconnected by the peer: %s\n", i,
                           ev->reason);
                else
                    disconnected++;
                done = 1;
                break;
            default:
                printf("ib_connect: connection %ld: %s: %s (%s)\n", i,
                       ibcm_event_str(ev->event), ibcm_strerror(ev->status), ev->reason);
                done = is_final(ev);
            }
            check(ibcm_ack_event(ctx, ev), "ibcm_ack_event");
        }
    }
    clock_gettime(CLOCK_MONOTONIC, &t1);
    check(ibcm_close(ctx), "ibcm_close");
    double secs = (double)(t1.tv_sec - t0.tv_sec) + (double)(t1.tv_nsec - t0.tv_nsec) / 1e9;
    printf("ib_connect: %ld connections in %.3f s (%.0f conn/s: each connect, established "
           "and disconnected before the next)\n",
           count, secs, secs > 0 ? (double)count / secs : 0.0);
    printf("ib_connect: %ld established, %ld disconnected\n", established, disconnected);
    return established == count && disconnected == count ? 0 : 1;
}
