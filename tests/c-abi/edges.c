/*
 * edges.c -- connection edges of issue 26 §1, in a single-threaded program.
 *
 *   edges SERVER_SOCKET CLIENT_SOCKET SERVER_IP QPN_BASE ROUNDS
 *
 * ROUNDS times: the client connects with the automatic RTU; the server accepts with REP
 * private data; the moment the server sees ESTABLISHED (the RTU arrived) the client calls
 * ibcm_disconnect on its handle, which may still be sending that RTU (between the REP and
 * the RTU). Checks, counted over the rounds and reported together:
 *
 *   - ibcm_disconnect returns IBCM_OK in every state, between the REP and the RTU too
 *     (§1.2: it returned IBCM_EBUSY there); the client then sees ESTABLISHED, then
 *     DISCONNECTED;
 *   - the client's ESTABLISHED carries the REP's private data (§1.3, as rdma_cm's does);
 *   - an ordinary DISCONNECTED has status IBCM_OK on both sides (§1.6: it had
 *     IBCM_ECLOSED); by_peer is 0 at the client and 1 at the server.
 *
 * Then once more with IBCM_CONNECT_MANUAL_RTU: the client passes private data to
 * ibcm_establish, and the server's ESTABLISHED must carry it (§1.3: the RTU's private data
 * never reached the passive side).
 *
 * Prints "checked: ..." lines and exits 1 if any round broke one; counts no connection.
 */
#include "example.h"

#define SID 0x10000000c0de0005ULL

static struct ibcm_ctx *ctx[2];

int main(int argc, char **argv)
{
    if (argc != 6) {
        fprintf(stderr, "usage: edges SERVER_SOCKET CLIENT_SOCKET SERVER_IP QPN_BASE ROUNDS\n");
        return 2;
    }
    uint32_t base = (uint32_t)strtoul(argv[4], NULL, 0);
    int rounds = atoi(argv[5]);
    check(ibcm_open(argv[1], &ctx[0]), "ibcm_open (server)");
    check(ibcm_open(argv[2], &ctx[1]), "ibcm_open (client)");
    check(ibcm_listen(ctx[0], SID), "ibcm_listen");

    int busy = 0, early = 0, no_rep_pd = 0, bad_status = 0, bad_by_peer = 0;
    for (int r = 0; r < rounds; r++) {
        struct ibcm_conn_param p;
        uint64_t h, srv = 0;
        check(ibcm_conn_param_init(&p), "ibcm_conn_param_init");
        p.peer = argv[3];
        p.service_id = SID;
        p.qp_num = base + 2 * (uint32_t)r;
        check(ibcm_connect(ctx[1], &p, &h), "ibcm_connect");
        char rep_pd[32];
        snprintf(rep_pd, sizeof rep_pd, "rep private data %d", r);
        int asked = 0, srv_up = 0, cli_up = 0, cli_done = 0, srv_done = 0;
        while (!(cli_done && srv_done)) {
            int which;
            struct ibcm_event *ev = next_event(ctx, 2, 30000, &which);
            int type = ev->event;
            if (which == 0 && type == IBCM_EVENT_CONNECT_REQUEST) {
                struct ibcm_accept_param ap;
                check(ibcm_accept_param_init(ctx[0], &ap), "ibcm_accept_param_init");
                ap.qp_num = base + 2 * (uint32_t)r + 1;
                ap.private_data = (const uint8_t *)rep_pd;
                ap.private_data_len = sizeof rep_pd;
                srv = ev->conn;
                check(ibcm_accept(ctx[0], srv, &ap), "ibcm_accept");
            } else if (which == 0 && type == IBCM_EVENT_ESTABLISHED && ev->conn == srv) {
                /* The RTU arrived: the client may not have finished sending it. */
                srv_up = 1;
                int rc = ibcm_disconnect(ctx[1], h, NULL, 0);
                if (rc == IBCM_EBUSY)
                    busy++; /* retried once the client's ESTABLISHED is taken */
                else
                    check(rc, "ibcm_disconnect (client, between the REP and the RTU)");
                asked = rc == IBCM_OK;
                if (asked && cli_up)
                    early++; /* the client was established already: not the window */
            } else if (which == 1 && type == IBCM_EVENT_ESTABLISHED && ev->conn == h) {
                cli_up = 1;
                if (ev->private_data_len < sizeof rep_pd ||
                    memcmp(ev->private_data, rep_pd, sizeof rep_pd) != 0)
                    no_rep_pd++;
            } else if (type == IBCM_EVENT_DISCONNECTED &&
                       ev->conn == (which == 0 ? srv : h)) {
                if (ev->status != IBCM_OK)
                    bad_status++;
                if (ev->by_peer != (which == 0))
                    bad_by_peer++;
                if (which == 0)
                    srv_done = 1;
                else if (!cli_up)
                    fail("%s", "the client's DISCONNECTED came without its ESTABLISHED");
                else
                    cli_done = 1;
            } else {
                fprintf(stderr, "round %d: context %d: %s: %s\n", r, which,
                        ibcm_event_str(type), ev->reason);
                fail("unexpected event %s", ibcm_event_str(type));
            }
            check(ibcm_ack_event(ctx[which], ev), "ibcm_ack_event");
            if (cli_up && srv_up && !asked) {
                /* The old answer was EBUSY: disconnect now that the client is up. */
                int rc = ibcm_disconnect(ctx[1], h, NULL, 0);
                if (rc == IBCM_OK)
                    asked = 1;
            }
        }
    }
    printf("checked: %d rounds; the client's disconnect came before its ESTABLISHED in %d\n",
           rounds, rounds - early);
    int bad = 0;
    if (busy) {
        printf("FAIL: ibcm_disconnect between the REP and the RTU returned IBCM_EBUSY in %d of "
               "%d rounds\n", busy, rounds);
        bad = 1;
    } else {
        printf("checked: ibcm_disconnect between the REP and the RTU -> IBCM_OK in all %d "
               "rounds (queued, DISCONNECTED after ESTABLISHED)\n", rounds);
    }
    if (no_rep_pd) {
        printf("FAIL: the client's ESTABLISHED lacked the REP's private data in %d of %d "
               "rounds\n", no_rep_pd, rounds);
        bad = 1;
    } else {
        printf("checked: the client's ESTABLISHED carries the REP's private data\n");
    }
    if (bad_status || bad_by_peer) {
        printf("FAIL: DISCONNECTED with a status other than IBCM_OK %d times, with the wrong "
               "by_peer %d times (of %d)\n", bad_status, bad_by_peer, 2 * rounds);
        bad = 1;
    } else {
        printf("checked: an ordinary DISCONNECTED has status IBCM_OK on both sides\n");
    }
    {
        /* The RTU's private data reaches the passive side's ESTABLISHED. */
        struct ibcm_conn_param p;
        uint64_t h, srv = 0;
        const char rtu_pd[] = "rtu private data";
        check(ibcm_conn_param_init(&p), "ibcm_conn_param_init");
        p.peer = argv[3];
        p.service_id = SID;
        p.qp_num = base + 2 * (uint32_t)rounds;
        p.flags = IBCM_CONNECT_MANUAL_RTU;
        check(ibcm_connect(ctx[1], &p, &h), "ibcm_connect (manual RTU)");
        int got = -1, done = 0;
        uint32_t got_len = 0;
        while (got < 0 || !done) {
            int which;
            struct ibcm_event *ev = next_event(ctx, 2, 30000, &which);
            int type = ev->event;
            if (which == 0 && type == IBCM_EVENT_CONNECT_REQUEST) {
                struct ibcm_accept_param ap;
                check(ibcm_accept_param_init(ctx[0], &ap), "ibcm_accept_param_init");
                ap.qp_num = base + 2 * (uint32_t)rounds + 1;
                srv = ev->conn;
                check(ibcm_accept(ctx[0], srv, &ap), "ibcm_accept");
            } else if (which == 1 && type == IBCM_EVENT_CONNECT_RESPONSE && ev->conn == h) {
                check(ibcm_establish(ctx[1], h, (const uint8_t *)rtu_pd, sizeof rtu_pd),
                      "ibcm_establish (with private data)");
            } else if (which == 1 && type == IBCM_EVENT_ESTABLISHED && ev->conn == h) {
                done = 1;
            } else if (which == 0 && type == IBCM_EVENT_ESTABLISHED && ev->conn == srv) {
                /* Trailing zeros trimmed: the string without its NUL. */
                got = ev->private_data_len == strlen(rtu_pd) &&
                      memcmp(ev->private_data, rtu_pd, strlen(rtu_pd)) == 0;
                got_len = ev->private_data_len;
            } else {
                fprintf(stderr, "manual RTU: context %d: %s: %s\n", which,
                        ibcm_event_str(type), ev->reason);
                fail("unexpected event %s", ibcm_event_str(type));
            }
            check(ibcm_ack_event(ctx[which], ev), "ibcm_ack_event");
        }
        if (!got) {
            printf("FAIL: the server's ESTABLISHED lacked the private data the client passed "
                   "to ibcm_establish (the RTU's): %u bytes\n", got_len);
            bad = 1;
        } else {
            printf("checked: the server's ESTABLISHED carries the RTU's private data\n");
        }
        check(ibcm_disconnect(ctx[1], h, NULL, 0), "ibcm_disconnect (manual RTU)");
        int ends = 0;
        while (ends < 2) {
            int which;
            struct ibcm_event *ev = next_event(ctx, 2, 30000, &which);
            if (ev->event == IBCM_EVENT_DISCONNECTED)
                ends++;
            check(ibcm_ack_event(ctx[which], ev), "ibcm_ack_event");
        }
    }
    check(ibcm_close(ctx[1]), "ibcm_close (client)");
    check(ibcm_close(ctx[0]), "ibcm_close (server)");
    if (bad)
        return 1;
    printf("edges: %d connections disconnected between the REP and the RTU as documented\n",
           rounds);
    return 0;
}
