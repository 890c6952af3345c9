/*
 * rc.c -- RC connections through two ibcmd daemons with libibcm, in the kernel's QP order.
 *
 *   rc SERVER_SOCKET CLIENT_SOCKET SERVER_IP COUNT [QPN_BASE]
 *
 * One context attaches to the server node's daemon and listens; another attaches to the
 * client node's daemon and opens COUNT connections to SERVER_IP at once, each stopping at
 * the REP (IBCM_CONNECT_MANUAL_RTU). One progress loop polls both contexts' fds:
 *
 *   server  CONNECT_REQUEST   QP attributes for INIT and RTR (from the REQ and the REP it
 *                             will send), then ibcm_accept
 *   client  CONNECT_RESPONSE  attributes for RTR and RTS (from its REQ and the REP), then
 *                             ibcm_establish (the RTU)
 *   server  ESTABLISHED       attributes for RTS
 *   client  ESTABLISHED       ibcm_disconnect (the DREQ)
 *   both    DISCONNECTED      client by_peer 0, server by_peer 1
 *
 * The attributes of the two sides are checked against each other (QPNs, PSNs) and printed
 * as a verbs runtime would pass them to ibv_modify_qp (no QP exists: the daemons run the
 * simulated backend). The client's QPNs are QPN_BASE (default 0x100) + i, the server's
 * QPN_BASE + 0x1000 + i: a QPN is quarantined while its last connection is in TimeWait, so
 * runs against the same daemons use different bases. Each connection that both sides saw
 * established and ended prints "torn down: ..."; anything else fails with exit status 1.
 */
#include "example.h"

#define SID 0x10000000c0de0001ULL
#define CLIENT_QPN qpn_base
#define SERVER_QPN (qpn_base + 0x1000)
#define MAXC 64

static int count, qpn_base = 0x100;
static uint64_t cli_handle[MAXC], srv_handle[MAXC];
static uint32_t req_psn[MAXC], rep_psn[MAXC];
static int cli_done[MAXC], srv_done[MAXC], srv_est[MAXC], torn;

static int client_index(uint64_t h)
{
    for (int i = 0; i < count; i++)
        if (cli_handle[i] == h)
            return i;
    fail("%s", "an event for an unknown client connection");
    return -1;
}

static int server_index(uint64_t h)
{
    for (int i = 0; i < count; i++)
        if (srv_handle[i] == h)
            return i;
    fail("%s", "an event for an unknown server connection");
    return -1;
}

static void maybe_done(int i)
{
    if (cli_done[i] && srv_done[i]) {
        printf("torn down: rc conn %d (client qpn %#x, server qpn %#x)\n", i, CLIENT_QPN + i,
               SERVER_QPN + i);
        torn++;
    }
}

static void on_server(struct ibcm_ctx *s, struct ibcm_event *ev)
{
    struct ibcm_qp_attr a;
    int mask, i;
    switch (ev->event) {
    case IBCM_EVENT_CONNECT_REQUEST: {
        i = (int)ev->remote_qpn - CLIENT_QPN;
        if (i < 0 || i >= count || ev->service_id != SID || ev->transport != IBCM_TRANSPORT_RC)
            fail("%s", "an unexpected REQ");
        char want[16];
        snprintf(want, sizeof want, "rc %d", i);
        if (ev->private_data_len < strlen(want) ||
            memcmp(ev->private_data, want, strlen(want)) != 0)
            fail("%s", "the REQ's private data is not the client's");
        srv_handle[i] = ev->conn;
        req_psn[i] = ev->remote_psn;
        struct ibcm_accept_param ap;
        check(ibcm_accept_param_init(s, &ap), "ibcm_accept_param_init");
        ap.qp_num = SERVER_QPN + i;
        rep_psn[i] = ap.starting_psn;
        /* The kernel's order: the QP goes to RTR before the REP is sent. */
        check(ibcm_init_qp_attr(s, ev->conn, IBCM_QPS_INIT, NULL, &ap, &a, &mask), "INIT attr");
        show_attr("server", i, "INIT", &a, mask);
        check(ibcm_init_qp_attr(s, ev->conn, IBCM_QPS_RTR, NULL, &ap, &a, &mask), "RTR attr");
        show_attr("server", i, "RTR", &a, mask);
        const int rtr = MASK_AV | MASK_DEST_QPN | MASK_RQ_PSN;
        if ((mask & rtr) != rtr ||
            a.dest_qp_num != ev->remote_qpn || a.rq_psn != ap.starting_psn ||
            a.qp_type != IBCM_QPT_RC)
            fail("%s", "server RTR attributes do not match the REQ and REP");
        check(ibcm_accept(s, ev->conn, &ap), "ibcm_accept");
        break;
    }
    case IBCM_EVENT_ESTABLISHED:
        i = server_index(ev->conn);
        /* The RTU arrived: RTS. */
        check(ibcm_init_qp_attr(s, ev->conn, IBCM_QPS_RTS, NULL, NULL, &a, &mask), "RTS attr");
        show_attr("server", i, "RTS", &a, mask);
        if (!(mask & MASK_SQ_PSN) || a.sq_psn != req_psn[i])
            fail("%s", "server RTS: the send PSN is not the one the REQ asked for");
        srv_est[i] = 1;
        break;
    case IBCM_EVENT_DISCONNECTED:
        i = server_index(ev->conn);
        if (!srv_est[i] || !ev->by_peer)
            fail("server: %s", "a DISCONNECTED that is not the client's DREQ after the RTU");
        printf("server conn %d: disconnected by the peer: %s\n", i, ev->reason);
        srv_done[i] = 1;
        maybe_done(i);
        break;
    default:
        fail("server: unexpected event %s", ibcm_event_str(ev->event));
    }
}

static void on_client(struct ibcm_ctx *c, struct ibcm_event *ev)
{
    struct ibcm_qp_attr a;
    int mask, i = client_index(ev->conn);
    switch (ev->event) {
    case IBCM_EVENT_CONNECT_RESPONSE:
        if (ev->remote_qpn != (uint32_t)(SERVER_QPN + i) || ev->remote_psn != rep_psn[i])
            fail("%s", "the REP does not carry the server's QPN and PSN");
        check(ibcm_init_qp_attr(c, ev->conn, IBCM_QPS_RTR, NULL, NULL, &a, &mask), "RTR attr");
        show_attr("client", i, "RTR", &a, mask);
        if (a.dest_qp_num != (uint32_t)(SERVER_QPN + i) || a.rq_psn != req_psn[i])
            fail("%s", "client RTR attributes do not match the server's");
        check(ibcm_init_qp_attr(c, ev->conn, IBCM_QPS_RTS, NULL, NULL, &a, &mask), "RTS attr");
        show_attr("client", i, "RTS", &a, mask);
        if (a.sq_psn != rep_psn[i])
            fail("%s", "client RTS: the send PSN is not the REP's");
        /* The QP is in RTS: the RTU may go. */
        check(ibcm_establish(c, ev->conn, NULL, 0), "ibcm_establish");
        break;
    case IBCM_EVENT_ESTABLISHED:
        printf("established: rc conn %d comm_id %#x (qpn %#x <-> %#x)\n", i, ev->comm_id,
               CLIENT_QPN + i, ev->remote_qpn);
        check(ibcm_disconnect(c, ev->conn, NULL, 0), "ibcm_disconnect");
        break;
    case IBCM_EVENT_DISCONNECTED:
        if (ev->by_peer)
            fail("client: %s", "disconnected by the peer, not by this side");
        printf("client conn %d: %s\n", i, ev->reason);
        cli_done[i] = 1;
        maybe_done(i);
        break;
    default:
        fprintf(stderr, "client conn %d: %s: %s\n", i, ibcm_event_str(ev->event), ev->reason);
        fail("client: unexpected event %s", ibcm_event_str(ev->event));
    }
}

int main(int argc, char **argv)
{
    if (argc != 5 && argc != 6) {
        fprintf(stderr, "usage: rc SERVER_SOCKET CLIENT_SOCKET SERVER_IP COUNT [QPN_BASE]\n");
        return 2;
    }
    count = atoi(argv[4]);
    if (argc == 6)
        qpn_base = (int)strtol(argv[5], NULL, 0);
    if (qpn_base < 1 || qpn_base > 0xf00000)
        fail("%s", "QPN_BASE must be 1..0xf00000");
    if (count < 1 || count > MAXC)
        fail("%s", "COUNT must be 1..64");
    struct ibcm_ctx *ctx[2];
    check(ibcm_open(argv[1], &ctx[0]), "ibcm_open (server)");
    check(ibcm_open(argv[2], &ctx[1]), "ibcm_open (client)");
    check(ibcm_listen(ctx[0], SID), "ibcm_listen");

    for (int i = 0; i < count; i++) {
        char pd[16];
        struct ibcm_conn_param p;
        check(ibcm_conn_param_init(&p), "ibcm_conn_param_init");
        p.peer = argv[3];
        p.service_id = SID;
        p.qp_num = CLIENT_QPN + i;
        p.flags = IBCM_CONNECT_MANUAL_RTU;
        snprintf(pd, sizeof pd, "rc %d", i);
        p.private_data = (const uint8_t *)pd;
        p.private_data_len = (uint32_t)strlen(pd);
        check(ibcm_connect(ctx[1], &p, &cli_handle[i]), "ibcm_connect");
    }
    while (torn < count) {
        int which;
        struct ibcm_event *ev = next_event(ctx, 2, 30000, &which);
        if (ev->event == IBCM_EVENT_SERVICE_GONE)
            fail("the node service is gone: %s", ev->reason);
        if (which == 0)
            on_server(ctx[0], ev);
        else
            on_client(ctx[1], ev);
        check(ibcm_ack_event(ctx[which], ev), "ibcm_ack_event");
    }
    check(ibcm_unlisten(ctx[0], SID), "ibcm_unlisten");
    check(ibcm_close(ctx[1]), "ibcm_close (client)");
    check(ibcm_close(ctx[0]), "ibcm_close (server)");
    printf("rc: %d connections established and torn down\n", torn);
    return 0;
}
