/*
 * capi_peer.c -- a C program on libibcm against the kernel's rdma_cm (cells capi-*): it
 * reaches a kernel rdma_cm listener by IP and port, and serves a kernel rdma_cm client, through
 * the node's ibcmd (on umad in the lab's nocm VM). No QP of its own: the cells check the CM.
 *
 *   capi-peer connect SOCKET IP:PORT QPN   IBCM_CONNECT_RDMA_CM to the listener at IP:PORT;
 *                                          waits for ESTABLISHED, then for the peer's DREQ
 *                                          (ucmatose -C 0 disconnects once connected)
 *   capi-peer listen SOCKET PORT QPN       listens on rdma_cm's TCP port space PORT; accepts
 *                                          one client, disconnects once established
 *   capi-peer xrcd SOCKET PATH             ibcm_xrcd_open of the domain file PATH through an
 *                                          `ibcmd --backend verbs` on a device without XRC:
 *                                          must be IBCM_EUNSUPPORTED, the device's error in
 *                                          the text
 *
 * Prints one line per event ("event NAME ...") and last "capi-peer: ok" (exit 0), or
 * "capi-peer: FAIL ..." (exit 1).
 */
#include <ibcm.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static struct ibcm_ctx *ctx;

static void die(const char *what, int rc)
{
    printf("capi-peer: FAIL %s: %s (%d): %s\n", what, ibcm_strerror(rc), rc, ibcm_last_error());
    exit(1);
}

static void check(int rc, const char *what)
{
    if (rc != IBCM_OK)
        die(what, rc);
}

static struct ibcm_event *next(void)
{
    struct ibcm_event *ev;
    check(ibcm_wait_event(ctx, 30000, &ev), "ibcm_wait_event");
    printf("event %s conn=%llu comm_id=%#x status=%d rej_reason=%u by_peer=%u remote_qpn=%#x "
           "service_id=%#llx rdma_cm_src=%s rdma_cm_dst=%s reason=%s\n",
           ibcm_event_str(ev->event), (unsigned long long)ev->conn, ev->comm_id, ev->status,
           ev->rej_reason, ev->by_peer, ev->remote_qpn, (unsigned long long)ev->service_id,
           ev->rdma_cm_src, ev->rdma_cm_dst, ev->reason);
    fflush(stdout);
    return ev;
}

static int marker;

int main(int argc, char **argv)
{
    if (argc == 4 && strcmp(argv[1], "xrcd") == 0) {
        check(ibcm_open(argv[2], &ctx), "ibcm_open");
        int rc = ibcm_xrcd_open(ctx, "lab", argv[3], IBCM_XRCD_CREATE);
        printf("ibcm_xrcd_open: %s (%d): %s\n", ibcm_strerror(rc), rc,
               rc == IBCM_OK ? "" : ibcm_last_error());
        /* A service whose TGT QPs the daemon would create in a private domain. */
        uint32_t srqn = 0x100;
        int rc2 = ibcm_xrc_listen(ctx, 0x10000000c0de7e00ULL, IBCM_XRC_PROCESS, &srqn, 1);
        printf("ibcm_xrc_listen: %s (%d): %s\n", ibcm_strerror(rc2), rc2,
               rc2 == IBCM_OK ? "" : ibcm_last_error());
        check(ibcm_close(ctx), "ibcm_close");
        if (rc != IBCM_EUNSUPPORTED || rc2 != IBCM_EUNSUPPORTED) {
            printf("capi-peer: FAIL want IBCM_EUNSUPPORTED from both\n");
            return 1;
        }
        printf("capi-peer: ok\n");
        return 0;
    }
    if (argc != 5 || (strcmp(argv[1], "connect") && strcmp(argv[1], "listen"))) {
        fprintf(stderr, "usage: capi-peer connect SOCKET IP:PORT QPN | listen SOCKET PORT QPN | "
                        "xrcd SOCKET PATH\n");
        return 2;
    }
    uint32_t qpn = (uint32_t)strtoul(argv[4], NULL, 0);
    check(ibcm_open(argv[2], &ctx), "ibcm_open");
    int established = 0;
    if (strcmp(argv[1], "connect") == 0) {
        struct ibcm_conn_param p;
        uint64_t h;
        check(ibcm_conn_param_init(&p), "ibcm_conn_param_init");
        p.peer = argv[3];
        p.qp_num = qpn;
        p.flags = IBCM_CONNECT_RDMA_CM;
        p.context = &marker;
        check(ibcm_connect(ctx, &p, &h), "ibcm_connect");
        printf("connecting to rdma_cm %s (service ID of its port), handle %llu\n", argv[3],
               (unsigned long long)h);
        for (;;) {
            struct ibcm_event *ev = next();
            int type = ev->event, by_peer = ev->by_peer, status = ev->status;
            if (ev->context != &marker) {
                printf("capi-peer: FAIL an event without the connection's context pointer\n");
                return 1;
            }
            check(ibcm_ack_event(ctx, ev), "ibcm_ack_event");
            if (type == IBCM_EVENT_ESTABLISHED) {
                established = 1;
            } else if (type == IBCM_EVENT_DISCONNECTED && established && by_peer &&
                       status == IBCM_OK) {
                break;
            } else {
                printf("capi-peer: FAIL unexpected %s\n", ibcm_event_str(type));
                return 1;
            }
        }
    } else {
        uint16_t port = (uint16_t)atoi(argv[3]);
        uint64_t sid = ibcm_rdma_cm_service_id(IBCM_PS_TCP, port);
        check(ibcm_listen(ctx, sid), "ibcm_listen");
        printf("listening on rdma_cm port %u (service ID %#llx)\n", port,
               (unsigned long long)sid);
        fflush(stdout);
        uint64_t h = 0;
        for (;;) {
            struct ibcm_event *ev = next();
            int type = ev->event, by_peer = ev->by_peer, status = ev->status;
            if (type == IBCM_EVENT_CONNECT_REQUEST && h == 0) {
                if (ev->rdma_cm_src[0] == '\0') {
                    printf("capi-peer: FAIL a request without rdma_cm's CMA header\n");
                    return 1;
                }
                h = ev->conn;
                struct ibcm_accept_param ap;
                check(ibcm_accept_param_init(ctx, &ap), "ibcm_accept_param_init");
                ap.qp_num = qpn;
                check(ibcm_accept(ctx, h, &ap), "ibcm_accept");
            } else if (type == IBCM_EVENT_ESTABLISHED && ev->conn == h) {
                established = 1;
                check(ibcm_disconnect(ctx, h, NULL, 0), "ibcm_disconnect");
            } else if (type == IBCM_EVENT_DISCONNECTED && ev->conn == h && established &&
                       !by_peer && status == IBCM_OK) {
                check(ibcm_ack_event(ctx, ev), "ibcm_ack_event");
                break;
            } else {
                printf("capi-peer: FAIL unexpected %s\n", ibcm_event_str(type));
                return 1;
            }
            check(ibcm_ack_event(ctx, ev), "ibcm_ack_event");
        }
    }
    check(ibcm_close(ctx), "ibcm_close");
    printf("capi-peer: ok\n");
    return 0;
}
