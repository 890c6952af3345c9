/*
 * rdmacm_peer.c -- the active side for tests/c-abi/rdmacm.c: a libibcm client whose REQ
 * reaches the librdmacm drop-in's listener, which answers it with a reject.
 *
 *   rdmacm_peer SOCKET IP:PORT QPN PRIVATE_DATA REJ_PRIVATE_DATA
 *
 * Connects through the daemon at SOCKET to the rdma_cm address IP:PORT
 * (IBCM_CONNECT_RDMA_CM: libibcm puts the CMA header before PRIVATE_DATA) from QP number
 * QPN, and waits (30 s at most) for the connection's final event. Exits 0 when it is
 * REJECTED with reason 28 (consumer defined, what rdma_reject and rdma_destroy_id of an
 * unanswered request send) and exactly REJ_PRIVATE_DATA as the REJ's private data ("" for
 * none); anything else exits 1 and says what came.
 */
#include "example.h"

int main(int argc, char **argv)
{
    if (argc != 6) {
        fprintf(stderr, "usage: rdmacm_peer SOCKET IP:PORT QPN PRIVATE_DATA REJ_PRIVATE_DATA\n");
        return 2;
    }
    const char *want = argv[5];
    struct ibcm_ctx *ctx;
    struct ibcm_conn_param p;
    uint64_t h;
    check(ibcm_open(argv[1], &ctx), "ibcm_open");
    check(ibcm_conn_param_init(&p), "ibcm_conn_param_init");
    p.peer = argv[2];
    p.flags = IBCM_CONNECT_RDMA_CM;
    p.qp_num = (uint32_t)strtoul(argv[3], NULL, 0);
    p.private_data = (const uint8_t *)argv[4];
    p.private_data_len = (uint32_t)strlen(argv[4]);
    check(ibcm_connect(ctx, &p, &h), "ibcm_connect");
    for (;;) {
        int which;
        struct ibcm_event *ev = next_event(&ctx, 1, 30000, &which);
        if (ev->conn != h || !is_final(ev)) {
            check(ibcm_ack_event(ctx, ev), "ibcm_ack_event");
            continue;
        }
        if (ev->event != IBCM_EVENT_REJECTED || ev->rej_reason != 28 ||
            ev->private_data_len != strlen(want) ||
            (ev->private_data_len && memcmp(ev->private_data, want, strlen(want)) != 0)) {
            fprintf(stderr, "rdmacm_peer: FAIL: %s (reason %u, %u bytes of private data: %s), "
                    "wanted REJECTED with reason 28 and \"%s\"\n", ibcm_event_str(ev->event),
                    (unsigned)ev->rej_reason, (unsigned)ev->private_data_len,
                    ev->reason ? ev->reason : "", want);
            return 1;
        }
        printf("rdmacm_peer: %s: REJECTED, reason 28, private data \"%s\"\n", argv[2], want);
        check(ibcm_ack_event(ctx, ev), "ibcm_ack_event");
        break;
    }
    check(ibcm_close(ctx), "ibcm_close");
    return 0;
}
