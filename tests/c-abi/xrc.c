/*
 * xrc.c -- XRC INI -> TGT connections through two ibcmd daemons with libibcm.
 *
 *   xrc TARGET_SOCKET INITIATOR_SOCKET TARGET_IP COUNT [POLICY [QPN_BASE]]
 *
 * POLICY: explicit, domain, process (default) or shared. The INI QPNs are QPN_BASE (default
 * 0x300) + i (a QPN is quarantined while its last connection is in TimeWait).
 * The target context has its node's daemon serve an XRC service (ibcm_xrc_listen): the
 * daemon creates the TGT QPs (owned by this context, with the policy given, default
 * "process") and answers the REQs; the context hears about them as XRC_REPORT events. The
 * initiator context opens COUNT XRC connections from its INI QPs, each stopping at the REP
 * to compute the INI QP's RTR and RTS attributes (the REP names the TGT QP), then sends the
 * RTU. When every connection is established on both sides they are torn down two ways:
 *
 *   conn 0      the initiator disconnects (DREQ); the target reports it closed;
 *   conn 1..    the target's owner destroys its TGT QPs (ibcm_xrc_destroy): the daemon sends
 *               each initiator a DREQ whose private data says "target gone (owner destroyed
 *               it)", which the initiator's DISCONNECTED event carries (target_gone, reason).
 *
 * Each connection the initiator saw established and then ended as expected prints
 * "torn down: ..."; anything else fails with exit status 1. COUNT must be 2 or more.
 */
#include "example.h"

#define SID 0x10000000c0de0002ULL
#define INI_QPN qpn_base
#define MAXC 64

static int qpn_base = 0x300;
static int count, established, tgt_established, tgt_closed, torn, destroyed;
static uint64_t ini_handle[MAXC];
static uint32_t tgt_qpn[MAXC];

static int ini_index(uint64_t h)
{
    for (int i = 0; i < count; i++)
        if (ini_handle[i] == h)
            return i;
    fail("%s", "an event for an unknown initiator connection");
    return -1;
}

static int policy_of(const char *s)
{
    if (!strcmp(s, "explicit"))
        return IBCM_XRC_EXPLICIT;
    if (!strcmp(s, "domain"))
        return IBCM_XRC_DOMAIN;
    if (!strcmp(s, "process"))
        return IBCM_XRC_PROCESS;
    if (!strcmp(s, "shared"))
        return IBCM_XRC_SHARED;
    fail("unknown policy %s", s);
    return -1;
}

/* Every connection is up on both sides: start the teardown with connection 0. */
static void maybe_teardown(struct ibcm_ctx *ini)
{
    if (established == count && tgt_established == count) {
        printf("all %d XRC connections established: the initiator disconnects conn 0\n", count);
        check(ibcm_disconnect(ini, ini_handle[0], NULL, 0), "ibcm_disconnect");
        tgt_established = -1; /* once */
    }
}

static void on_target(struct ibcm_ctx *ini, struct ibcm_event *ev)
{
    if (ev->event != IBCM_EVENT_XRC_REPORT)
        fail("target: unexpected event %s", ibcm_event_str(ev->event));
    printf("target report: %s\n", ev->reason);
    switch (ev->xrc_report) {
    case IBCM_XRC_ESTABLISHED:
        tgt_established++;
        maybe_teardown(ini);
        break;
    case IBCM_XRC_CLOSED:
        tgt_closed++;
        break;
    case IBCM_XRC_REJECTED:
        fail("target: %s", ev->reason);
        break;
    default:
        break;
    }
}

static void on_initiator(struct ibcm_ctx *tgt, struct ibcm_ctx *ini, struct ibcm_event *ev)
{
    struct ibcm_qp_attr a;
    int mask, i = ini_index(ev->conn);
    switch (ev->event) {
    case IBCM_EVENT_CONNECT_RESPONSE:
        /* The REP names the TGT QP (its Local EECN): the INI QP's destination. */
        tgt_qpn[i] = ev->remote_qpn;
        check(ibcm_init_qp_attr(ini, ev->conn, IBCM_QPS_INIT, NULL, NULL, &a, &mask), "INIT");
        show_attr("ini", i, "INIT", &a, mask);
        check(ibcm_init_qp_attr(ini, ev->conn, IBCM_QPS_RTR, NULL, NULL, &a, &mask), "RTR");
        show_attr("ini", i, "RTR", &a, mask);
        if (a.qp_type != IBCM_QPT_XRC_SEND || a.dest_qp_num != ev->remote_qpn ||
            ev->remote_qpn == 0 || !(mask & MASK_DEST_QPN))
            fail("%s", "INI RTR attributes do not name the TGT QP");
        check(ibcm_init_qp_attr(ini, ev->conn, IBCM_QPS_RTS, NULL, NULL, &a, &mask), "RTS");
        show_attr("ini", i, "RTS", &a, mask);
        if (a.sq_psn != ev->remote_psn || !(mask & MASK_SQ_PSN))
            fail("%s", "INI RTS: the send PSN is not the REP's");
        /* An XRC INI's REQ carries retry count 0; the QP gets the one asked for. */
        if (a.retry_cnt != 7)
            fail("%s", "INI RTS: the retry count is not the one asked for (7)");
        check(ibcm_establish(ini, ev->conn, NULL, 0), "ibcm_establish");
        break;
    case IBCM_EVENT_ESTABLISHED:
        printf("established: xrc conn %d comm_id %#x (ini qpn %#x -> tgt qpn %#x)\n", i,
               ev->comm_id, INI_QPN + i, ev->remote_qpn);
        established++;
        maybe_teardown(ini);
        break;
    case IBCM_EVENT_DISCONNECTED:
        if (i == 0) {
            if (ev->by_peer || ev->target_gone)
                fail("conn 0: %s", "expected this side's own DREQ");
            printf("torn down: xrc conn 0 (tgt qpn %#x): %s\n", tgt_qpn[0], ev->reason);
            torn++;
            /* Now the owner destroys the TGT QPs: the rest hear it from the target. */
            uint64_t n = 0;
            check(ibcm_xrc_destroy(tgt, &n), "ibcm_xrc_destroy");
            printf("target destroyed %llu TGT QP(s) as their owner\n", (unsigned long long)n);
            destroyed = (int)n;
        } else {
            if (!ev->by_peer || !ev->target_gone || !strstr(ev->reason, "owner destroyed"))
                fail("a DISCONNECTED without the target-gone cause: %s", ev->reason);
            printf("torn down: xrc conn %d (tgt qpn %#x): %s\n", i, tgt_qpn[i], ev->reason);
            torn++;
        }
        break;
    default:
        if (is_final(ev))
            fprintf(stderr, "ini conn %d: %s: %s\n", i, ibcm_event_str(ev->event), ev->reason);
        fail("initiator: unexpected event %s", ibcm_event_str(ev->event));
    }
}

int main(int argc, char **argv)
{
    if (argc < 5 || argc > 7) {
        fprintf(stderr,
                "usage: xrc TARGET_SOCKET INITIATOR_SOCKET TARGET_IP COUNT [POLICY [QPN_BASE]]\n");
        return 2;
    }
    if (argc == 7)
        qpn_base = (int)strtol(argv[6], NULL, 0);
    if (qpn_base < 1 || qpn_base > 0xf00000)
        fail("%s", "QPN_BASE must be 1..0xf00000");
    count = atoi(argv[4]);
    if (count < 2 || count > MAXC)
        fail("%s", "COUNT must be 2..64");
    int policy = policy_of(argc >= 6 ? argv[5] : "process");
    struct ibcm_ctx *ctx[2];
    check(ibcm_open(argv[1], &ctx[0]), "ibcm_open (target)");
    check(ibcm_open(argv[2], &ctx[1]), "ibcm_open (initiator)");
    /* The SRQ numbers the REPs announce (the target runtime's SRQs). */
    const uint32_t srqns[] = {0x10, 0x11};
    check(ibcm_xrc_listen(ctx[0], SID, policy, srqns, 2), "ibcm_xrc_listen");

    for (int i = 0; i < count; i++) {
        struct ibcm_conn_param p;
        check(ibcm_conn_param_init(&p), "ibcm_conn_param_init");
        p.peer = argv[3];
        p.service_id = SID;
        p.transport = IBCM_TRANSPORT_XRC;
        p.qp_num = INI_QPN + i;
        p.flags = IBCM_CONNECT_MANUAL_RTU;
        check(ibcm_connect(ctx[1], &p, &ini_handle[i]), "ibcm_connect");
    }
    /* Until every initiator connection ended and the target reported each one closed. */
    while (torn < count || tgt_closed < count) {
        int which;
        struct ibcm_event *ev = next_event(ctx, 2, 30000, &which);
        if (ev->event == IBCM_EVENT_SERVICE_GONE)
            fail("the node service is gone: %s", ev->reason);
        if (which == 0)
            on_target(ctx[1], ev);
        else
            on_initiator(ctx[0], ctx[1], ev);
        check(ibcm_ack_event(ctx[which], ev), "ibcm_ack_event");
    }
    if (destroyed < 1)
        fail("%s", "the target destroyed no TGT QP");
    check(ibcm_xrc_unlisten(ctx[0], SID), "ibcm_xrc_unlisten");
    check(ibcm_close(ctx[1]), "ibcm_close (initiator)");
    check(ibcm_close(ctx[0]), "ibcm_close (target)");
    printf("xrc: %d connections established and torn down\n", torn);
    return 0;
}
