/*
 * ib_apm.c -- Automatic Path Migration through libibcm: COUNT connections in a row, each
 * with an alternate path in its REQ, migrated and given its former primary path back as
 * the new alternate (a LAP), through one ibcmd.
 *
 *   ib_apm SOCKET TARGET SERVICE_ID COUNT [QPN_BASE]
 *
 * TARGET is "gid:G" (or "lid:N") through an ibcmd on a native InfiniBand port: each connect
 * asks for an alternate path too (IBCM_CONNECT_ALT_PATH: the daemon's SA gives the primary
 * path and, among a GetTable's paths, one with another SLID and DLID; a fabric whose SM
 * gives ports two LIDs, LMC 1). The passive side is `ib_listen --accept-laps` (it loads
 * every alternate path proposed). Each connection, one after the other, from QPN
 * QPN_BASE + i (default 0x3000 + i):
 *
 *   1. the REQ and the REP (IBCM_CONNECT_MANUAL_RTU): the RTR attributes for an InfiniBand
 *      port must load the REQ's alternate path (IBV_QP_ALT_PATH, a DLID; counted in
 *      "alternate paths"), RTS arms it (IBV_MIG_REARM); the RTU;
 *   2. established: the QP "migrates" (there is no QP: the program reports it, as a
 *      runtime does on IBV_EVENT_PATH_MIG) with ibcm_path_migrated: the alternate path is
 *      the primary one now (ibcm_query_path says so);
 *   3. the former primary path is proposed as the new alternate (ibcm_load_alt_path, a
 *      LAP); the APR must say 0, "path loaded" (counted in "LAPs loaded"), and the
 *      alternate path's attributes (ibcm_init_alt_path_attr) must name its DLID;
 *   4. ibcm_disconnect and the DREP.
 *
 * The first connection's paths are printed (`ib_apm: paths to TARGET: primary lid A -> B,
 * alternate lid C -> D`). A connection that fails prints why and the next one is tried.
 * Last:
 *
 *   ib_apm: N established, N alternate paths, N LAPs loaded, N disconnected
 *
 * and exit 0 if all four are COUNT, 1 otherwise. With an IP TARGET (daemons on UDP: the
 * loopback check of tests/c-abi/run) there is no SA and so no alternate path in the REQ:
 * each LAP proposes a made-up path (LIDs 0x100 + i -> 0x200 + i) instead, "alternate paths"
 * must be 0 and the other three COUNT.
 */
#include "example.h"

#include <inttypes.h>

enum { MASK_ALT_PATH = 1 << 14, MASK_PATH_MIG_STATE = 1 << 18 };

int main(int argc, char **argv)
{
    if (argc != 5 && argc != 6) {
        fprintf(stderr, "usage: ib_apm SOCKET TARGET SERVICE_ID COUNT [QPN_BASE]\n");
        return 2;
    }
    const char *target = argv[2];
    uint64_t sid = strtoull(argv[3], NULL, 0);
    long count = strtol(argv[4], NULL, 0);
    long qpn_base = argc == 6 ? strtol(argv[5], NULL, 0) : 0x3000;
    if (count < 1 || count > 100000)
        fail("%s", "COUNT must be 1..100000");
    if (qpn_base < 1 || qpn_base + count > 0xffffff)
        fail("%s", "QPN_BASE + COUNT must stay below 0xffffff");
    int ib = strncmp(target, "lid:", 4) == 0 || strncmp(target, "gid:", 4) == 0;
    /* The daemon's InfiniBand port (P_Key index 0: the paths are in its P_Key 0). The
     * alternate path's attributes are computed for it in both modes. */
    const struct ibcm_port port = {
        .port_num = 1, .sgid_index = 0, .lmc = 0, .pkey_index = 0,
        .link_layer = IBCM_LINK_LAYER_INFINIBAND,
    };

    struct ibcm_ctx *ctx;
    check(ibcm_open(argv[1], &ctx), "ibcm_open");
    long established = 0, alternates = 0, laps = 0, disconnected = 0;
    for (long i = 0; i < count; i++) {
        struct ibcm_conn_param p;
        uint64_t h;
        char pd[32];
        struct ibcm_path lap; /* the path this connection's LAP proposes */
        check(ibcm_conn_param_init(&p), "ibcm_conn_param_init");
        p.peer = target;
        p.service_id = sid;
        p.qp_num = (uint32_t)(qpn_base + i);
        p.flags = IBCM_CONNECT_MANUAL_RTU | (ib ? IBCM_CONNECT_ALT_PATH : 0);
        snprintf(pd, sizeof pd, "ib_apm %ld", i);
        p.private_data = (const uint8_t *)pd;
        p.private_data_len = (uint32_t)strlen(pd);
        check(ibcm_connect(ctx, &p, &h), "ibcm_connect");
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
                struct ibcm_path alt;
                int has_alt = ibcm_query_path(ctx, h, IBCM_PATH_ALTERNATE, &alt) == IBCM_OK;
                if (has_alt && (mask & MASK_ALT_PATH) && a.alt_ah_attr.dlid != 0) {
                    alternates++;
                    if (a.alt_ah_attr.dlid != alt.remote_lid)
                        fail("%s", "the RTR attributes load another alternate DLID than the REQ's");
                } else if (ib) {
                    printf("ib_apm: connection %ld: no alternate path in the REQ (the SA has "
                           "none: is the SM's LMC 0?)\n", i);
                }
                if (i == 0) {
                    struct ibcm_path pri;
                    check(ibcm_query_path(ctx, h, IBCM_PATH_PRIMARY, &pri), "primary path");
                    if (has_alt)
                        printf("ib_apm: paths to %s: primary lid %u -> %u, alternate lid %u -> "
                               "%u\n", target, pri.local_lid, pri.remote_lid, alt.local_lid,
                               alt.remote_lid);
                    else
                        printf("ib_apm: paths to %s: primary lid %u -> %u, no alternate\n",
                               target, pri.local_lid, pri.remote_lid);
                }
                check(ibcm_init_qp_attr(ctx, h, IBCM_QPS_RTS, pp, NULL, &a, &mask), "RTS attr");
                if (has_alt && ib && (!(mask & MASK_PATH_MIG_STATE) || a.path_mig_state != 1))
                    fail("%s", "RTS does not arm the alternate path (IBV_MIG_REARM)");
                check(ibcm_establish(ctx, h, NULL, 0), "ibcm_establish");
                break;
            }
            case IBCM_EVENT_ESTABLISHED: {
                established++;
                /* IBV_EVENT_PATH_MIG: the QP now runs on the alternate path. */
                struct ibcm_path before, after;
                check(ibcm_query_path(ctx, h, IBCM_PATH_PRIMARY, &before), "primary path");
                struct ibcm_path alt;
                int has_alt = ibcm_query_path(ctx, h, IBCM_PATH_ALTERNATE, &alt) == IBCM_OK;
                check(ibcm_path_migrated(ctx, h), "ibcm_path_migrated");
                check(ibcm_query_path(ctx, h, IBCM_PATH_PRIMARY, &after), "primary path");
                if (has_alt && (after.local_lid != alt.local_lid ||
                                after.remote_lid != alt.remote_lid))
                    fail("%s", "after the migration the primary path is not the alternate");
                lap = before;
                if (!ib) {
                    /* No fabric: a made-up path, for the API and the protocol. */
                    lap.local_lid = (uint16_t)(0x100 + i % 0x100);
                    lap.remote_lid = (uint16_t)(0x200 + i % 0x100);
                }
                snprintf(pd, sizeof pd, "ib_apm lap %ld", i);
                check(ibcm_load_alt_path(ctx, h, &lap, (const uint8_t *)pd,
                                         (uint32_t)strlen(pd)),
                      "ibcm_load_alt_path");
                break;
            }
            case IBCM_EVENT_APR:
                if (ev->apr_status == 0) {
                    struct ibcm_qp_attr a;
                    int mask;
                    struct ibcm_path alt;
                    check(ibcm_init_alt_path_attr(ctx, h, &port, &a, &mask), "alt path attr");
                    check(ibcm_query_path(ctx, h, IBCM_PATH_ALTERNATE, &alt), "alternate path");
                    if (a.alt_ah_attr.dlid != lap.remote_lid || alt.remote_lid != lap.remote_lid)
                        fail("%s", "the loaded alternate path is not the one proposed");
                    laps++;
                } else {
                    printf("ib_apm: connection %ld: APR status %u: the path was not loaded\n", i,
                           ev->apr_status);
                }
                check(ibcm_disconnect(ctx, h, NULL, 0), "ibcm_disconnect");
                break;
            case IBCM_EVENT_LAP_ERROR:
                printf("ib_apm: connection %ld: LAP_ERROR: %s (%s)\n", i,
                       ibcm_strerror(ev->status), ev->reason);
                check(ibcm_disconnect(ctx, h, NULL, 0), "ibcm_disconnect");
                break;
            case IBCM_EVENT_DISCONNECTED:
                if (ev->by_peer)
                    printf("ib_apm: connection %ld: disconnected by the peer: %s\n", i,
                           ev->reason);
                else
                    disconnected++;
                done = 1;
                break;
            default:
                printf("ib_apm: connection %ld: %s: %s (%s)\n", i, ibcm_event_str(ev->event),
                       ibcm_strerror(ev->status), ev->reason);
                done = is_final(ev);
            }
            check(ibcm_ack_event(ctx, ev), "ibcm_ack_event");
        }
    }
    check(ibcm_close(ctx), "ibcm_close");
    printf("ib_apm: %ld established, %ld alternate paths, %ld LAPs loaded, %ld disconnected\n",
           established, alternates, laps, disconnected);
    long want_alt = ib ? count : 0;
    return established == count && alternates == want_alt && laps == count &&
                   disconnected == count
               ? 0
               : 1;
}
