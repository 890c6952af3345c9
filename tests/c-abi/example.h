/*
 * example.h -- what both libibcm examples share: failing loudly, and a progress loop over
 * several contexts' event fds with poll(2), the way a C runtime drives libibcm.
 */
#ifndef IBCM_EXAMPLE_H
#define IBCM_EXAMPLE_H

#include <ibcm.h>
#include <poll.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* Exits with the call's status, its text and this thread's last error message. */
static inline void check(int rc, const char *what)
{
    if (rc != IBCM_OK) {
        fprintf(stderr, "FAIL: %s: %s (%d): %s\n", what, ibcm_strerror(rc), rc,
                ibcm_last_error());
        exit(1);
    }
}

static inline void fail(const char *fmt, const char *detail)
{
    fprintf(stderr, "FAIL: ");
    fprintf(stderr, fmt, detail);
    fprintf(stderr, "\n");
    exit(1);
}

/* One event of any of the `n` contexts, waiting up to `timeout_ms` in poll(2) on their fds;
 * `*which` says whose. Fails when nothing comes in time. The event is acked by the caller. */
static inline struct ibcm_event *next_event(struct ibcm_ctx **ctxs, int n, int timeout_ms,
                                            int *which)
{
    struct pollfd fds[8];
    if (n > 8)
        fail("%s", "too many contexts");
    for (;;) {
        for (int i = 0; i < n; i++) {
            struct ibcm_event *ev;
            int rc = ibcm_get_event(ctxs[i], &ev);
            if (rc == IBCM_OK) {
                *which = i;
                return ev;
            }
            if (rc != IBCM_EAGAIN)
                check(rc, "ibcm_get_event");
        }
        for (int i = 0; i < n; i++) {
            fds[i].fd = ibcm_get_fd(ctxs[i]);
            fds[i].events = POLLIN;
            fds[i].revents = 0;
        }
        int r = poll(fds, (nfds_t)n, timeout_ms);
        if (r == 0)
            fail("%s", "no event within the deadline");
        if (r < 0)
            fail("%s", "poll failed");
    }
}

/* Whether an event is a connection's final one. */
static inline int is_final(const struct ibcm_event *ev)
{
    return ev->event == IBCM_EVENT_REJECTED || ev->event == IBCM_EVENT_UNREACHABLE ||
           ev->event == IBCM_EVENT_CONNECT_ERROR || ev->event == IBCM_EVENT_DISCONNECTED ||
           ev->event == IBCM_EVENT_SIDR_REPLY;
}

/* Prints the attributes a verbs runtime would hand to ibv_modify_qp. */
static inline void show_attr(const char *who, int i, const char *state,
                             const struct ibcm_qp_attr *a, int mask)
{
    printf("%s conn %d %s: mask=%#x qp_type=%u dest_qpn=%#x rq_psn=%#x sq_psn=%#x "
           "mtu=%u timeout=%u retry=%u rnr_retry=%u rd_atomic=%u/%u grh=%u hop_limit=%u\n",
           who, i, state, (unsigned)mask, a->qp_type, a->dest_qp_num, a->rq_psn, a->sq_psn,
           a->path_mtu, a->timeout, a->retry_cnt, a->rnr_retry, a->max_rd_atomic,
           a->max_dest_rd_atomic, a->ah_attr.is_global, a->ah_attr.grh.hop_limit);
}

/* The ibv_qp_attr_mask bits the examples check. */
enum { MASK_STATE = 1 << 0, MASK_AV = 1 << 7, MASK_RQ_PSN = 1 << 12, MASK_SQ_PSN = 1 << 16,
       MASK_DEST_QPN = 1 << 20 };

#endif
