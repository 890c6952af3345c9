/*
 * parity.c -- what a runtime written for rdma_cm expects of libibcm (issue 26 §3).
 *
 *   parity SERVER_SOCKET CLIENT_SOCKET SERVER_IP CLIENT_IP QPN_BASE
 *
 * Two contexts (the server on one ibcmd, the client on the other), one progress loop:
 *
 *  1. context pointers: the listener's (ibcm_listen_context) reaches the CONNECT_REQUEST,
 *     ibcm_set_context replaces it for the connection's later events; the client's
 *     (ibcm_conn_param.context) is in every event of its connection;
 *  2. handles are unique in the process: no handle number is seen on both contexts;
 *  3. rdma_cm addressing: the server listens on ibcm_rdma_cm_service_id(IBCM_PS_TCP, port),
 *     the client connects by "IP:PORT" with IBCM_CONNECT_RDMA_CM; the server sees the CMA
 *     header's addresses (rdma_cm_src, rdma_cm_dst) and the private data after it;
 *  4. an MRA for a REP (manual RTU): ibcm_mra on a CONNECT_RESPONSE handle, counted by both
 *     daemons (mra_sent at the client's, mra_rcvd at the server's: ibcm_query_counters);
 *  5. an accept that does not wait for the daemon: a second accept with a QP number in use
 *     returns IBCM_OK and its refusal comes as CONNECT_ERROR (status IBCM_EQPN), the client
 *     hearing a REJ;
 *  6. SIDR both ways: a query answered (QPN, Q_Key, private data), one whose SIDR_REQUEST
 *     is acknowledged unanswered (status 2, rejected), one to a service nobody serves
 *     (status 1);
 *  7. the endpoint counters from C.
 *
 * Prints "checked: ..." lines and one "torn down: ..." per connection established and ended.
 */
#include "example.h"

#define SID 0x10000000c0de0026ULL
#define SIDR_SID 0x10000000c0de5d1dULL
#define RDMA_CM_PORT 7471

static struct ibcm_ctx *ctx[2];
static int srv_tag, conn_tag, cli_tag, sidr_tag;
static uint64_t seen[2][64];
static int n_seen[2];

/* Remembers that context `which` handed out handle `h`; fails if the other one did too. */
static void saw(int which, uint64_t h)
{
    if (h == 0)
        return;
    for (int i = 0; i < n_seen[1 - which]; i++)
        if (seen[1 - which][i] == h)
            fail("handle %s seen on both contexts", "");
    if (n_seen[which] < 64)
        seen[which][n_seen[which]++] = h;
}

static struct ibcm_event *next(int *which)
{
    struct ibcm_event *ev = next_event(ctx, 2, 30000, which);
    saw(*which, ev->conn);
    return ev;
}

static uint64_t counter(struct ibcm_ctx *c, const char *name)
{
    struct ibcm_counter cs[128];
    uint32_t n = 0;
    check(ibcm_query_counters(c, NULL, 0, &n), "ibcm_query_counters (size)");
    if (n == 0 || n > 128)
        fail("%s: implausible number of counters", name);
    uint32_t m = 0;
    check(ibcm_query_counters(c, cs, n, &m), "ibcm_query_counters");
    if (m != n)
        fail("%s: the counter count changed", name);
    for (uint32_t i = 0; i < n; i++)
        if (strcmp(cs[i].name, name) == 0)
            return cs[i].value;
    for (uint32_t i = 0; i < n; i++)
        fprintf(stderr, "counter %s = %llu\n", cs[i].name, (unsigned long long)cs[i].value);
    fail("no counter %s", name);
    return 0;
}

/* Disconnects `h` of context `ci` and waits for both sides' DISCONNECTED. */
static void tear_down(int ci, uint64_t h, uint64_t other, void *ctx_want, const char *what)
{
    check(ibcm_disconnect(ctx[ci], h, NULL, 0), "ibcm_disconnect");
    int done = 0;
    while (done < 2) {
        int which;
        struct ibcm_event *ev = next(&which);
        if (ev->event == IBCM_EVENT_DISCONNECTED && (ev->conn == h || ev->conn == other)) {
            if (ev->conn == other && ctx_want && ev->context != ctx_want)
                fail("%s: DISCONNECTED without the handle's context pointer", what);
            done++;
        }
        check(ibcm_ack_event(ctx[which], ev), "ibcm_ack_event");
    }
    printf("torn down: %s\n", what);
}

int main(int argc, char **argv)
{
    if (argc != 6) {
        fprintf(stderr, "usage: parity SERVER_SOCKET CLIENT_SOCKET SERVER_IP CLIENT_IP QPN_BASE\n");
        return 2;
    }
    const char *srv_ip = argv[3], *cli_ip = argv[4];
    uint32_t qpn = (uint32_t)strtoul(argv[5], NULL, 0);
    check(ibcm_open(argv[1], &ctx[0]), "ibcm_open (server)");
    check(ibcm_open(argv[2], &ctx[1]), "ibcm_open (client)");

    /* 1, 2, 4: context pointers and an MRA for the REP. */
    check(ibcm_listen_context(ctx[0], SID, &srv_tag), "ibcm_listen_context");
    uint64_t mra_sent0 = counter(ctx[1], "mra_sent"), mra_rcvd0 = counter(ctx[0], "mra_received");
    struct ibcm_conn_param p;
    uint64_t h, srv = 0;
    check(ibcm_conn_param_init(&p), "ibcm_conn_param_init");
    p.peer = srv_ip;
    p.service_id = SID;
    p.qp_num = qpn;
    p.flags = IBCM_CONNECT_MANUAL_RTU;
    p.context = &cli_tag;
    check(ibcm_connect(ctx[1], &p, &h), "ibcm_connect");
    saw(1, h);
    int srv_up = 0, cli_up = 0;
    while (!(srv_up && cli_up)) {
        int which;
        struct ibcm_event *ev = next(&which);
        if (which == 1 && ev->context != &cli_tag)
            fail("client event %s without its context pointer", ibcm_event_str(ev->event));
        if (which == 0 && ev->event == IBCM_EVENT_CONNECT_REQUEST) {
            if (ev->context != &srv_tag)
                fail("%s", "CONNECT_REQUEST without the listener's context pointer");
            srv = ev->conn;
            check(ibcm_set_context(ctx[0], srv, &conn_tag), "ibcm_set_context");
            struct ibcm_accept_param ap;
            check(ibcm_accept_param_init(ctx[0], &ap), "ibcm_accept_param_init");
            ap.qp_num = qpn + 1;
            check(ibcm_accept(ctx[0], srv, &ap), "ibcm_accept");
        } else if (which == 1 && ev->event == IBCM_EVENT_CONNECT_RESPONSE) {
            check(ibcm_mra(ctx[1], h, 14), "ibcm_mra (for the REP)");
            check(ibcm_establish(ctx[1], h, NULL, 0), "ibcm_establish");
        } else if (which == 1 && ev->event == IBCM_EVENT_ESTABLISHED) {
            cli_up = 1;
        } else if (which == 0 && ev->event == IBCM_EVENT_ESTABLISHED) {
            if (ev->context != &conn_tag)
                fail("%s", "server ESTABLISHED without the pointer ibcm_set_context set");
            srv_up = 1;
        } else if (is_final(ev)) {
            fail("unexpected %s", ibcm_event_str(ev->event));
        }
        check(ibcm_ack_event(ctx[which], ev), "ibcm_ack_event");
    }
    printf("checked: context pointers: the listener's in CONNECT_REQUEST, ibcm_set_context's "
           "after, the client's in every event\n");
    uint64_t mra_sent = counter(ctx[1], "mra_sent") - mra_sent0;
    uint64_t mra_rcvd = counter(ctx[0], "mra_received") - mra_rcvd0;
    if (mra_sent < 1 || mra_rcvd < 1)
        fail("%s", "the MRA for the REP was not counted as sent and received");
    printf("checked: MRA for a REP: mra_sent +%llu at the client's daemon, mra_received +%llu at the "
           "server's\n", (unsigned long long)mra_sent, (unsigned long long)mra_rcvd);
    tear_down(1, h, srv, &conn_tag, "context pointers and MRA for the REP");

    /* 3, 5: rdma_cm addressing, and an accept refused after it returned. */
    uint64_t rsid = ibcm_rdma_cm_service_id(IBCM_PS_TCP, RDMA_CM_PORT);
    if (rsid != 0x01061d2fULL)
        fail("%s", "ibcm_rdma_cm_service_id");
    check(ibcm_listen(ctx[0], rsid), "ibcm_listen (rdma_cm port)");
    char dst[64];
    snprintf(dst, sizeof dst, "%s:%d", srv_ip, RDMA_CM_PORT);
    const char *hello = "hello rdma_cm";
    check(ibcm_conn_param_init(&p), "ibcm_conn_param_init");
    p.peer = dst;
    p.qp_num = qpn + 2;
    p.flags = IBCM_CONNECT_RDMA_CM;
    p.private_data = (const uint8_t *)hello;
    p.private_data_len = IBCM_REQ_RDMA_CM_PRIVATE_DATA_MAX + 1;
    if (ibcm_connect(ctx[1], &p, &h) != IBCM_ETOOLONG)
        fail("%s", "57 bytes of private data after the CMA header were not IBCM_ETOOLONG");
    p.private_data_len = (uint32_t)strlen(hello);
    p.service_id = rsid;
    if (ibcm_connect(ctx[1], &p, &h) != IBCM_EINVAL)
        fail("%s", "a service ID with IBCM_CONNECT_RDMA_CM was not IBCM_EINVAL");
    p.service_id = 0;
    uint64_t h2;
    check(ibcm_connect(ctx[1], &p, &h), "ibcm_connect (rdma_cm)");
    p.qp_num = qpn + 4;
    check(ibcm_connect(ctx[1], &p, &h2), "ibcm_connect (rdma_cm, second)");
    uint64_t srv1 = 0, srv2 = 0, srv_est = 0, cli1 = 0;
    int up = 0, refused = 0, rejected = 0, accepts = 0;
    while (up < 2 || !refused || !rejected) {
        int which;
        struct ibcm_event *ev = next(&which);
        if (which == 0 && ev->event == IBCM_EVENT_CONNECT_REQUEST) {
            char want_src[64];
            snprintf(want_src, sizeof want_src, "%s:", cli_ip);
            if (ev->service_id != rsid || strncmp(ev->rdma_cm_src, want_src, strlen(want_src)) ||
                strcmp(ev->rdma_cm_dst, dst) != 0)
                fail("rdma_cm addresses: %s", ev->rdma_cm_src);
            if (ev->private_data_len < strlen(hello) ||
                memcmp(ev->private_data, hello, strlen(hello)) != 0)
                fail("%s", "the private data after the CMA header");
            printf("checked: rdma_cm REQ: service ID %#llx, from %s to %s, private data after "
                   "the CMA header\n", (unsigned long long)ev->service_id, ev->rdma_cm_src,
                   ev->rdma_cm_dst);
            struct ibcm_accept_param ap;
            check(ibcm_accept_param_init(ctx[0], &ap), "ibcm_accept_param_init");
            ap.qp_num = qpn + 3; /* both accepts name it: the daemon refuses the one it sees second */
            if (accepts++ == 0)
                srv1 = ev->conn;
            else
                srv2 = ev->conn;
            check(ibcm_accept(ctx[0], ev->conn, &ap), "ibcm_accept (returns before the daemon)");
        } else if (which == 0 && ev->event == IBCM_EVENT_CONNECT_ERROR &&
                   (ev->conn == srv1 || ev->conn == srv2) && !refused) {
            if (ev->status != IBCM_EQPN)
                fail("refused accept: status %s", ibcm_strerror(ev->status));
            printf("checked: accept refused after it returned: CONNECT_ERROR %s: %s\n",
                   ibcm_strerror(ev->status), ev->reason);
            refused = 1;
        } else if (which == 1 && ev->event == IBCM_EVENT_REJECTED) {
            rejected = 1;
        } else if (ev->event == IBCM_EVENT_ESTABLISHED) {
            if (which == 1)
                cli1 = ev->conn;
            else
                srv_est = ev->conn;
            up++;
        } else if (is_final(ev)) {
            fail("unexpected %s", ibcm_event_str(ev->event));
        }
        check(ibcm_ack_event(ctx[which], ev), "ibcm_ack_event");
    }
    (void)h2;
    check(ibcm_unlisten(ctx[0], rsid), "ibcm_unlisten");
    tear_down(0, srv_est, cli1, NULL, "rdma_cm by IP and port");

    /* 6: SIDR both ways. */
    check(ibcm_listen(ctx[0], SIDR_SID), "ibcm_listen (SIDR)");
    struct ibcm_sidr_param sp;
    check(ibcm_sidr_param_init(&sp), "ibcm_sidr_param_init");
    sp.peer = srv_ip;
    sp.service_id = SIDR_SID;
    sp.private_data = (const uint8_t *)"who serves";
    sp.private_data_len = 10;
    sp.timeout_ms = 500;
    sp.max_retries = 3;
    sp.context = &sidr_tag;
    uint64_t q[3];
    check(ibcm_sidr_query(ctx[1], &sp, &q[0]), "ibcm_sidr_query");
    check(ibcm_sidr_query(ctx[1], &sp, &q[1]), "ibcm_sidr_query (second)");
    sp.service_id = SIDR_SID + 1;
    check(ibcm_sidr_query(ctx[1], &sp, &q[2]), "ibcm_sidr_query (nobody serves it)");
    int answers = 0, requests = 0;
    uint32_t status[3] = {9, 9, 9};
    while (answers < 3) {
        int which;
        struct ibcm_event *ev = next(&which);
        if (which == 0 && ev->event == IBCM_EVENT_SIDR_REQUEST) {
            if (ev->private_data_len < 10 || memcmp(ev->private_data, "who serves", 10) != 0)
                fail("%s", "SIDR_REQUEST private data");
            if (requests++ == 0) {
                struct ibcm_sidr_rep_param rp = {.status = 0, .qp_num = 0x1234,
                                                 .qkey = 0x11111111,
                                                 .private_data = (const uint8_t *)"udp here",
                                                 .private_data_len = 8};
                check(ibcm_sidr_reply(ctx[0], ev->conn, &rp), "ibcm_sidr_reply");
            } /* the second is acknowledged unanswered: rejected */
        } else if (which == 1 && ev->event == IBCM_EVENT_SIDR_REPLY) {
            if (ev->context != &sidr_tag)
                fail("%s", "SIDR_REPLY without its context pointer");
            int i = ev->conn == q[0] ? 0 : ev->conn == q[1] ? 1 : 2;
            status[i] = ev->sidr_status;
            if (ev->sidr_status == 0 &&
                (ev->remote_qpn != 0x1234 || ev->qkey != 0x11111111 ||
                 ev->private_data_len < 8 || memcmp(ev->private_data, "udp here", 8) != 0))
                fail("%s", "SIDR_REPLY fields");
            answers++;
        } else {
            fail("unexpected %s", ibcm_event_str(ev->event));
        }
        check(ibcm_ack_event(ctx[which], ev), "ibcm_ack_event");
    }
    /* The first request was answered and the second rejected, in either order. */
    if (!((status[0] == 0 && status[1] == 2) || (status[0] == 2 && status[1] == 0)) ||
        status[2] != 1)
        fail("%s", "SIDR statuses (want success, rejected, unsupported service ID)");
    printf("checked: SIDR both ways: answered (QPN 0x1234, Q_Key, private data), rejected when "
           "acknowledged unanswered, status 1 for a service nobody serves\n");

    /* 7: the counters. */
    uint32_t n = 0;
    check(ibcm_query_counters(ctx[0], NULL, 0, &n), "ibcm_query_counters");
    uint64_t est = counter(ctx[0], "established");
    if (est < 2)
        fail("%s", "the server's daemon counted fewer than 2 established connections");
    (void)counter(ctx[0], "dropped.wrong_peer");
    printf("checked: %u counters from C (established %llu, dropped.* by reason)\n", n,
           (unsigned long long)est);
    check(ibcm_close(ctx[1]), "ibcm_close");
    check(ibcm_close(ctx[0]), "ibcm_close");
    printf("parity: ok\n");
    return 0;
}
