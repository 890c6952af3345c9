/*
 * errors.c -- libibcm's failure paths through two ibcmd daemons.
 *
 *   errors SERVER_SOCKET CLIENT_SOCKET SERVER_IP SILENT_IP QPN_BASE
 *
 * SILENT_IP is a loopback address where no CM listens. Checks, each printing "checked: ...":
 * a second client's listen on a taken service ID is refused; a REQ the server rejects
 * reaches the client as REJECTED with the reason and private data, and the server's handle
 * ends with CONNECT_ERROR, as when it disconnects an unanswered REQ; a connect to SILENT_IP
 * ends UNREACHABLE after its timeout; a connect cancelled with ibcm_disconnect ends with
 * CONNECT_ERROR; a connection the client ends while the server still handles its
 * ESTABLISHED keeps its QP attributes until its final event is acknowledged; bad
 * arguments (an IPv6 peer through these IPv4 daemons among them), unknown handles and a
 * second ack are refused with their codes. Anything else fails with exit status 1.
 */
#include "example.h"

#define SID 0x10000000c0de0003ULL

static struct ibcm_ctx *ctx[2];

/* The next event; it must be `type` on context `who`. */
static struct ibcm_event *expect(int who, int type)
{
    int which;
    struct ibcm_event *ev = next_event(ctx, 2, 30000, &which);
    if (which != who || (int)ev->event != type) {
        fprintf(stderr, "got %s on context %d (%s), wanted %s on %d\n",
                ibcm_event_str(ev->event), which, ev->reason, ibcm_event_str(type), who);
        exit(1);
    }
    return ev;
}

/* The next event of context `who` alone; it must be `type`. */
static struct ibcm_event *expect_on(int who, int type)
{
    int which;
    struct ibcm_event *ev = next_event(ctx + who, 1, 30000, &which);
    if ((int)ev->event != type) {
        fprintf(stderr, "got %s on context %d (%s), wanted %s\n", ibcm_event_str(ev->event),
                who, ev->reason, ibcm_event_str(type));
        exit(1);
    }
    return ev;
}

static void want(int rc, int code, const char *what)
{
    if (rc != code) {
        fprintf(stderr, "FAIL: %s: got %s (%d: %s), wanted %s\n", what, ibcm_strerror(rc), rc,
                ibcm_last_error(), ibcm_strerror(code));
        exit(1);
    }
    printf("checked: %s -> %s (%s)\n", what, ibcm_strerror(rc), rc ? ibcm_last_error() : "");
}

static uint64_t connect_to(const char *ip, uint32_t qpn, uint32_t timeout_ms)
{
    struct ibcm_conn_param p;
    uint64_t h;
    check(ibcm_conn_param_init(&p), "ibcm_conn_param_init");
    p.peer = ip;
    p.service_id = SID;
    p.qp_num = qpn;
    p.timeout_ms = timeout_ms;
    check(ibcm_connect(ctx[1], &p, &h), "ibcm_connect");
    return h;
}

int main(int argc, char **argv)
{
    if (argc != 6) {
        fprintf(stderr, "usage: errors SERVER_SOCKET CLIENT_SOCKET SERVER_IP SILENT_IP QPN_BASE\n");
        return 2;
    }
    uint32_t base = (uint32_t)strtoul(argv[5], NULL, 0);
    check(ibcm_open(argv[1], &ctx[0]), "ibcm_open (server)");
    check(ibcm_open(argv[2], &ctx[1]), "ibcm_open (client)");
    check(ibcm_listen(ctx[0], SID), "ibcm_listen");

    /* A service ID is one client's. */
    struct ibcm_ctx *other;
    check(ibcm_open(argv[1], &other), "ibcm_open (second server client)");
    want(ibcm_listen(other, SID), IBCM_EREFUSED, "a second client listens on a taken service");
    check(ibcm_close(other), "ibcm_close (second server client)");
    want(ibcm_listen(ctx[0], SID), IBCM_EREFUSED, "listening twice on one context");

    /* The server rejects: the client hears the reason and the private data. */
    uint64_t h = connect_to(argv[3], base, 10000);
    struct ibcm_event *ev = expect(0, IBCM_EVENT_CONNECT_REQUEST);
    uint64_t srv = ev->conn;
    check(ibcm_ack_event(ctx[0], ev), "ack");
    /* An MRA first (the answer will take a while), then the reject. */
    want(ibcm_mra(ctx[0], srv, 20), IBCM_OK, "an MRA for the REQ");
    want(ibcm_mra(ctx[0], srv, 32), IBCM_EINVAL, "an MRA with service timeout 32");
    const uint8_t why[] = "busy";
    check(ibcm_reject(ctx[0], srv, 28, why, sizeof why), "ibcm_reject");
    ev = expect(0, IBCM_EVENT_CONNECT_ERROR);
    if (ev->conn != srv || ev->rej_reason != 28)
        fail("%s", "the server's handle did not end with its reject");
    check(ibcm_ack_event(ctx[0], ev), "ack");
    ev = expect(1, IBCM_EVENT_REJECTED);
    if (ev->conn != h || ev->rej_reason != 28 || ev->private_data_len < 4 ||
        memcmp(ev->private_data, "busy", 4) != 0)
        fail("%s", "REJECTED without the server's reason and private data");
    printf("checked: rejected by the server -> REJECTED reason %u: %s\n", ev->rej_reason,
           ev->reason);
    check(ibcm_ack_event(ctx[1], ev), "ack");
    want(ibcm_disconnect(ctx[1], h, NULL, 0), IBCM_ENOENT, "a call on an ended handle");

    /* The client disconnects right after its RTU, while the server still holds its
     * ESTABLISHED: the server's RTS attributes are still given, other calls are ECLOSED
     * until the final event is acknowledged, ENOENT after. */
    h = connect_to(argv[3], base + 7, 10000);
    ev = expect_on(0, IBCM_EVENT_CONNECT_REQUEST);
    srv = ev->conn;
    struct ibcm_accept_param ap0;
    check(ibcm_accept_param_init(ctx[0], &ap0), "ibcm_accept_param_init");
    ap0.qp_num = base + 6;
    check(ibcm_accept(ctx[0], srv, &ap0), "ibcm_accept");
    check(ibcm_ack_event(ctx[0], ev), "ack");
    ev = expect_on(1, IBCM_EVENT_ESTABLISHED);
    check(ibcm_disconnect(ctx[1], h, NULL, 0), "ibcm_disconnect (client)");
    check(ibcm_ack_event(ctx[1], ev), "ack");
    ev = expect_on(1, IBCM_EVENT_DISCONNECTED); /* the DREP: the server has the DREQ */
    check(ibcm_ack_event(ctx[1], ev), "ack");
    struct ibcm_event *est = expect_on(0, IBCM_EVENT_ESTABLISHED);
    struct pollfd pfd = {.fd = ibcm_get_fd(ctx[0]), .events = POLLIN};
    if (poll(&pfd, 1, 30000) != 1) /* readable: the final event is queued behind it */
        fail("%s", "the server's final event was not queued");
    struct ibcm_qp_attr qa;
    int qmask;
    want(ibcm_init_qp_attr(ctx[0], srv, IBCM_QPS_RTS, NULL, NULL, &qa, &qmask), IBCM_OK,
         "RTS attributes while ESTABLISHED is handled and the final event is queued");
    want(ibcm_disconnect(ctx[0], srv, NULL, 0), IBCM_ECLOSED,
         "a call on a handle whose final event is queued");
    check(ibcm_ack_event(ctx[0], est), "ack");
    ev = expect_on(0, IBCM_EVENT_DISCONNECTED);
    if (ev->conn != srv || !ev->by_peer)
        fail("%s", "the server's final event is not the client's DREQ");
    check(ibcm_ack_event(ctx[0], ev), "ack");
    want(ibcm_init_qp_attr(ctx[0], srv, IBCM_QPS_RTS, NULL, NULL, &qa, &qmask), IBCM_ENOENT,
         "RTS attributes once the final event is acknowledged");

    /* ibcm_disconnect on an unanswered REQ rejects it (REJ 28) without waiting: the two
     * contexts' final events come in either order. */
    h = connect_to(argv[3], base + 5, 10000);
    ev = expect(0, IBCM_EVENT_CONNECT_REQUEST);
    srv = ev->conn;
    check(ibcm_ack_event(ctx[0], ev), "ack");
    check(ibcm_disconnect(ctx[0], srv, NULL, 0), "ibcm_disconnect (a REQ)");
    int seen[2] = {0, 0};
    while (!seen[0] || !seen[1]) {
        int which;
        ev = next_event(ctx, 2, 30000, &which);
        int ok = which == 0 ? ev->event == IBCM_EVENT_CONNECT_ERROR && ev->conn == srv
                            : ev->event == IBCM_EVENT_REJECTED && ev->conn == h;
        if (!ok || seen[which] || ev->rej_reason != 28)
            fail("unexpected event %s after disconnecting a REQ", ibcm_event_str(ev->event));
        seen[which] = 1;
        check(ibcm_ack_event(ctx[which], ev), "ack");
    }
    printf("checked: ibcm_disconnect on an unanswered REQ -> REJECTED 28 at the client\n");

    /* Nobody answers: UNREACHABLE after the connect timeout. */
    h = connect_to(argv[4], base + 1, 500);
    ev = expect(1, IBCM_EVENT_UNREACHABLE);
    if (ev->conn != h)
        fail("%s", "UNREACHABLE for another handle");
    printf("checked: a silent peer -> UNREACHABLE: %s\n", ev->reason);
    check(ibcm_ack_event(ctx[1], ev), "ack");

    /* Cancelled while waiting for the REP. */
    h = connect_to(argv[4], base + 2, 0);
    check(ibcm_disconnect(ctx[1], h, NULL, 0), "ibcm_disconnect (cancel)");
    ev = expect(1, IBCM_EVENT_CONNECT_ERROR);
    if (ev->conn != h)
        fail("%s", "CONNECT_ERROR for another handle");
    printf("checked: cancelled before the REP -> CONNECT_ERROR: %s\n", ev->reason);
    want(ibcm_ack_event(ctx[1], ev), IBCM_OK, "acknowledging an event");
    want(ibcm_ack_event(ctx[1], ev), IBCM_EINVAL, "acknowledging it twice");

    /* Arguments. */
    struct ibcm_conn_param p;
    check(ibcm_conn_param_init(&p), "ibcm_conn_param_init");
    p.peer = argv[3];
    p.service_id = SID;
    want(ibcm_connect(ctx[1], &p, &h), IBCM_EINVAL, "QP number 0");
    p.qp_num = base + 3;
    p.peer = "not-an-address";
    want(ibcm_connect(ctx[1], &p, &h), IBCM_EINVAL, "a peer that is no address");
    uint8_t big[IBCM_REQ_PRIVATE_DATA_MAX + 1] = {0};
    p.peer = argv[3];
    p.private_data = big;
    p.private_data_len = sizeof big;
    want(ibcm_connect(ctx[1], &p, &h), IBCM_ETOOLONG, "93 bytes of REQ private data");
    want(ibcm_accept(ctx[0], 12345, NULL), IBCM_EINVAL, "accept without parameters");
    struct ibcm_accept_param ap;
    check(ibcm_accept_param_init(ctx[0], &ap), "ibcm_accept_param_init");
    ap.qp_num = base + 4;
    want(ibcm_accept(ctx[0], 12345, &ap), IBCM_ENOENT, "accept on an unknown handle");
    want(ibcm_get_event(ctx[0], NULL), IBCM_EINVAL, "get_event into NULL");
    want(ibcm_xrc_listen(ctx[0], SID + 1, 7, (const uint32_t[]){16}, 1), IBCM_EINVAL,
         "an unknown XRC policy");
    want(ibcm_xrc_listen(ctx[0], SID + 1, IBCM_XRC_PROCESS, (const uint32_t[]){1u << 30}, 1),
         IBCM_EREFUSED, "an SRQ number out of range");

    /* Issue 26 §1.6: the same mistake gets the same code. */
    want(ibcm_unlisten(ctx[0], SID + 9), IBCM_ENOENT, "unlisten on a service not listened on");
    want(ibcm_xrc_unlisten(ctx[0], SID + 9), IBCM_ENOENT,
         "xrc_unlisten on a service not served");
    uint32_t srqns[48]; /* IBCM_XRC_SRQNS_MAX + 1 */
    for (unsigned i = 0; i < 48; i++)
        srqns[i] = 16 + i;
    want(ibcm_xrc_listen(ctx[0], SID + 1, IBCM_XRC_PROCESS, srqns, 0), IBCM_EINVAL,
         "an XRC service with 0 SRQ numbers");
    want(ibcm_xrc_listen(ctx[0], SID + 1, IBCM_XRC_PROCESS, srqns, 48),
         IBCM_EINVAL, "an XRC service with 48 SRQ numbers");
    /* Peers that are no unicast host are refused at once (they timed out silently). */
    const char *no_host[] = {"0.0.0.0", "255.255.255.255", "224.0.0.1", "::", "ff02::1"};
    p.private_data = NULL;
    p.private_data_len = 0;
    for (unsigned i = 0; i < sizeof no_host / sizeof no_host[0]; i++) {
        char what[64];
        snprintf(what, sizeof what, "a connect to %s", no_host[i]);
        p.peer = no_host[i];
        want(ibcm_connect(ctx[1], &p, &h), IBCM_EINVAL, what);
    }
    /* An IPv6 peer through these IPv4 daemons is refused at once (it timed out silently). */
    const char *v6[] = {"::1", "fd00::2", "[fd00::2]:4791"};
    for (unsigned i = 0; i < sizeof v6 / sizeof v6[0]; i++) {
        char what[96];
        snprintf(what, sizeof what, "a connect to %s through an IPv4 daemon", v6[i]);
        p.peer = v6[i];
        want(ibcm_connect(ctx[1], &p, &h), IBCM_EINVAL, what);
    }

    check(ibcm_close(ctx[1]), "ibcm_close (client)");
    check(ibcm_close(ctx[0]), "ibcm_close (server)");
    printf("errors: every failure path answered as documented\n");
    return 0;
}
