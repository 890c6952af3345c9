/* cmpeer -- the conformance lab's kernel-side rdma_cm peer (C over librdmacm).
 *
 *   cmpeer server --port P [--bind ADDR] [--accept | --reject-pd HEX] [--accept-delay MS]
 *                 [--no-qp] [--accept-pd HEX] [--disconnect-after MS] [--disconnect-on FILE]
 *                 [--ps tcp|ib] [--qp rc|xrc] [--count N] [--timeout MS]
 *                 [--expect established|rejected|unreachable] [--hold-timewait]
 *   cmpeer client --addr A --port P [--src ADDR] [--pd HEX] [--count N] [--no-qp]
 *                 [--disconnect-after MS] [--disconnect-on FILE] [--ps tcp|ib] [--qp rc|xrc]
 *                 [--ack-timeout N] [--expect established|rejected|unreachable|gaveup]
 *                 [--timeout MS] [--establish-delay MS] [--reject-rep HEX] [--same-qpn]
 *                 [--stale]
 *   cmpeer mark ADDR TEXT      one UDP datagram TEXT to ADDR:9 (in-band pcap cell marker)
 *
 * server: listens on the rdma_cm port P (Service ID 0x0000000001060000+P for --ps tcp,
 *   0x00000000013F0000+P for --ps ib) and handles --count connection requests (default 1):
 *   --accept (default)   create an RC QP and rdma_accept (REP; the kernel then expects RTU)
 *   --reject-pd HEX      rdma_reject with that private data (REJ reason 28 "consumer")
 *   --accept-delay MS    sleep before accepting: if the active side retransmits its REQ
 *                        meanwhile, the kernel CM answers the duplicate with an MRA
 *   --no-qp              accept without a QP (REP carries the made-up QPN 0xc0ffe0+i); the
 *                        only way to get a kernel REP for --qp xrc on rxe
 *   --disconnect-after MS / --disconnect-on FILE   this side sends the DREQ MS after
 *                        ESTABLISHED / once FILE exists; otherwise it waits for the peer's
 *                        DREQ and answers with DREP (rdma_disconnect on DISCONNECTED)
 *   --expect rejected|unreachable   the accepted connection must end with REJECTED (the
 *                        peer rejects the REP) / UNREACHABLE (the REP retries ran out)
 *   --hold-timewait      after answering the peer's DREQ, keep the id until
 *                        RDMA_CM_EVENT_TIMEWAIT_EXIT (destroying it would take the kernel's
 *                        cm_id out of TimeWait) and print the port's cm_rx_duplicates/dreq
 *                        counter on both sides of TimeWait:
 *                        TIMEWAIT-ENTER conn=K dreq_duplicates=N   (read after the DREP went out)
 *                        TIMEWAIT-EXIT conn=K dreq_duplicates=M in_timewait=M-N
 *                        A duplicate DREQ counted in between reached the kernel's cm_id in
 *                        TimeWait (cm_dreq_handler answers it from there with a DREP).
 * client: resolves A, connects --count times in sequence with private data --pd, waits for
 *   the outcome; --ack-timeout N sets RDMA_OPTION_ID_ACK_TIMEOUT=N before route resolution,
 *   which makes the RoCE packet life time N-1 and so the REQ retry timeout
 *   2*ms(N-1) + ms(20) (N=1: 4.1 s instead of the default 6.1 s).
 *   --no-qp: on CONNECT_RESPONSE the client sends the RTU itself with rdma_establish, after
 *   --establish-delay MS (the kernel answers a duplicate REP meanwhile with an MRA), or
 *   rejects the REP with --reject-rep HEX (REJ 28, MsgRejected = REP, private data HEX).
 *   --same-qpn: every connection announces the same made-up QPN (--no-qp).
 *   --expect gaveup: no outcome within --timeout; the id is destroyed while connecting, and
 *   the kernel then sends REJ 4 (timeout) with its node GUID as ARI.
 *   --stale: connection 0 is established and held, then connection 1 announces the same QPN
 *   (--no-qp); expects REJECTED status=10 (stale connection) for 1 and the peer's DREQ for 0.
 *   --addr / --src / --bind take IPv4 or IPv6 addresses.
 *
 * Output, one line per fact, for the tests to grep:
 *   LISTEN port=P ps=tcp qp=rc                  CONNECT port=P ps=tcp qp=rc
 *   EVENT <RDMA_CM_EVENT name without prefix> [status=N] [pd=HEX pdlen=N]
 *     e.g. EVENT CONNECT_REQUEST pd=68656c6c6f pdlen=56    EVENT REJECTED status=28 pd=... pdlen=148
 *   ACTION ACCEPT|REJECT|DELAY|DISCONNECT ...
 *   RESULT ok|fail established=E rejected=R unreachable=U disconnected=D errors=X
 * pd= is the private data in hex with trailing zero bytes removed (the wire has no length;
 * rdma_cm reports fixed sizes: 56 for REQ after the 36-byte CMA header, 196 REP, 148 REJ).
 * Exit status 0 iff RESULT ok. */
#define _GNU_SOURCE
#include <arpa/inet.h>
#include <errno.h>
#include <getopt.h>
#include <netdb.h>
#include <poll.h>
#include <stdarg.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>
#include <rdma/rdma_cma.h>

#define FAKE_QPN 0xc0ffe0u
#define MAXC 64

static struct {
    int server, port, accept_delay, no_qp, reject, count, timeout_ms, disc_after, ack_timeout;
    int establish_delay, reject_rep, same_qpn, stale, hold_timewait;
    const char *addr, *src, *bind, *disc_file, *expect;
    enum rdma_port_space ps;
    int xrc;
    uint8_t pd[256], apd[256], rpd[256];
    int pdlen, apdlen, rpdlen;
} o = { .count = 1, .timeout_ms = 30000, .disc_after = -1, .ack_timeout = -1,
        .ps = RDMA_PS_TCP, .expect = "established" };

static struct { int established, rejected, unreachable, disconnected, errors, requests, gaveup, timewait_exits; } n;

static void out(const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    vprintf(fmt, ap);
    va_end(ap);
    putchar('\n');
    fflush(stdout);
}

static long long now_ms(void) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return t.tv_sec * 1000LL + t.tv_nsec / 1000000;
}

static int parse_hex(const char *s, uint8_t *buf, int max) {
    int len = 0;
    if (!strncmp(s, "0x", 2)) s += 2;
    while (s[0] && s[1] && len < max) {
        unsigned v;
        if (sscanf(s, "%2x", &v) != 1) break;
        buf[len++] = v;
        s += 2;
    }
    return len;
}

static const char *hex_trim(const void *p, int len) {
    static char buf[1024];
    const uint8_t *b = p;
    while (len > 0 && b[len - 1] == 0) len--;
    if (len > 500) len = 500;
    for (int i = 0; i < len; i++) sprintf(buf + 2 * i, "%02x", b[i]);
    buf[2 * len] = 0;
    return len ? buf : "-";
}

static const char *ev_name(enum rdma_cm_event_type e) {
    const char *s = rdma_event_str(e);
    return strncmp(s, "RDMA_CM_EVENT_", 14) ? s : s + 14;
}

static void print_event(struct rdma_cm_event *ev) {
    char extra[1200] = "";
    const void *pd = ev->param.conn.private_data;
    int len = ev->param.conn.private_data_len;
    switch (ev->event) {
    case RDMA_CM_EVENT_CONNECT_REQUEST:
    case RDMA_CM_EVENT_ESTABLISHED:
    case RDMA_CM_EVENT_CONNECT_RESPONSE:
        if (pd && len) snprintf(extra, sizeof extra, " pd=%s pdlen=%d", hex_trim(pd, len), len);
        break;
    case RDMA_CM_EVENT_REJECTED:
        snprintf(extra, sizeof extra, " status=%d pd=%s pdlen=%d", ev->status,
                 pd && len ? hex_trim(pd, len) : "-", pd ? len : 0);
        break;
    default:
        if (ev->status) snprintf(extra, sizeof extra, " status=%d", ev->status);
    }
    out("EVENT %s%s", ev_name(ev->event), extra);
}

/* wait for the next CM event on ch, up to ms (-1: o.timeout_ms); NULL on timeout */
static struct rdma_cm_event *next_event(struct rdma_event_channel *ch, int ms) {
    struct pollfd p = { .fd = ch->fd, .events = POLLIN };
    if (ms < 0) ms = o.timeout_ms;
    int r = poll(&p, 1, ms);
    if (r <= 0) return NULL;
    struct rdma_cm_event *ev;
    if (rdma_get_cm_event(ch, &ev)) { out("ERROR rdma_get_cm_event: %s", strerror(errno)); return NULL; }
    print_event(ev);
    return ev;
}

static int make_qp(struct rdma_cm_id *id) {
    struct ibv_qp_init_attr a;
    memset(&a, 0, sizeof a);
    a.qp_type = IBV_QPT_RC;
    a.cap.max_send_wr = a.cap.max_recv_wr = 4;
    a.cap.max_send_sge = a.cap.max_recv_sge = 1;
    if (rdma_create_qp(id, NULL, &a)) { out("ERROR rdma_create_qp: %s", strerror(errno)); return -1; }
    return 0;
}

static void fill_param(struct rdma_conn_param *cp, const uint8_t *pd, int pdlen, int idx) {
    memset(cp, 0, sizeof *cp);
    cp->private_data = pdlen ? pd : NULL;
    cp->private_data_len = pdlen;
    cp->responder_resources = 1;
    cp->initiator_depth = 1;
    cp->retry_count = 7;
    cp->rnr_retry_count = 7;
    if (o.no_qp) cp->qp_num = (FAKE_QPN + (o.same_qpn ? 0 : idx)) & 0xffffff;
}

static void destroy(struct rdma_cm_id *id) {
    if (id->qp) rdma_destroy_qp(id);
    rdma_destroy_id(id);
}

static int should_disconnect(long long est_at) {
    if (o.disc_after >= 0 && now_ms() >= est_at + o.disc_after) return 1;
    if (o.disc_file) { struct stat st; if (!stat(o.disc_file, &st)) return 1; }
    return 0;
}
static int wants_disconnect(void) { return o.disc_after >= 0 || o.disc_file; }

static int result(int ok) {
    out("RESULT %s established=%d rejected=%d unreachable=%d disconnected=%d gaveup=%d errors=%d",
        ok ? "ok" : "fail", n.established, n.rejected, n.unreachable, n.disconnected, n.gaveup, n.errors);
    return ok ? 0 : 1;
}

static const char *ps_name(void) { return o.ps == RDMA_PS_IB ? "ib" : "tcp"; }

/* an id with the right port space / QP type; XRC needs rdma_create_ep (librdmacm has no
 * public rdma_create_id with a QP type); the synchronous ep is then moved onto ch */
static struct rdma_cm_id *xrc_ep(struct rdma_event_channel *ch, int passive) {
    struct rdma_addrinfo hints, *res;
    struct rdma_cm_id *id;
    char port[16];
    memset(&hints, 0, sizeof hints);
    hints.ai_port_space = RDMA_PS_IB;
    hints.ai_qp_type = passive ? IBV_QPT_XRC_RECV : IBV_QPT_XRC_SEND;
    if (passive) hints.ai_flags = RAI_PASSIVE;
    snprintf(port, sizeof port, "%d", o.port);
    const char *node = passive ? o.bind : o.addr;
    if (!passive && o.src) {
        struct sockaddr_in *s = calloc(1, sizeof *s);
        s->sin_family = AF_INET;
        inet_pton(AF_INET, o.src, &s->sin_addr);
        hints.ai_src_addr = (struct sockaddr *)s;
        hints.ai_src_len = sizeof *s;
    }
    if (rdma_getaddrinfo(node, port, &hints, &res)) { out("ERROR rdma_getaddrinfo: %s", strerror(errno)); return NULL; }
    if (rdma_create_ep(&id, res, NULL, NULL)) { out("ERROR rdma_create_ep: %s", strerror(errno)); rdma_freeaddrinfo(res); return NULL; }
    rdma_freeaddrinfo(res);
    if (rdma_migrate_id(id, ch)) { out("ERROR rdma_migrate_id: %s", strerror(errno)); return NULL; }
    return id;
}

/* PEER addr=A port=P: the active side's address as the CMA header gave it */
static void print_peer(struct rdma_cm_id *id) {
    char buf[INET6_ADDRSTRLEN] = "?";
    struct sockaddr *sa = rdma_get_peer_addr(id);
    int port = 0;
    if (sa->sa_family == AF_INET6) {
        inet_ntop(AF_INET6, &((struct sockaddr_in6 *)sa)->sin6_addr, buf, sizeof buf);
        port = ntohs(((struct sockaddr_in6 *)sa)->sin6_port);
    } else if (sa->sa_family == AF_INET) {
        inet_ntop(AF_INET, &((struct sockaddr_in *)sa)->sin_addr, buf, sizeof buf);
        port = ntohs(((struct sockaddr_in *)sa)->sin_port);
    }
    out("PEER addr=%s port=%d", buf, port);
}

/* ---------------------------------------------------------------------------------------- */
struct conn {
    struct rdma_cm_id *id; long long est_at;
    int state;      /* 0 free 1 pending 2 est 3 disc-sent 4 TimeWait held (--hold-timewait) */
    long dup_dreq;  /* cm_rx_duplicates/dreq when TimeWait began */
};

/* the kernel CM's count of duplicate DREQs received on id's port (-1: unreadable) */
static long dreq_duplicates(struct rdma_cm_id *id) {
    char path[256];
    long v = -1;
    snprintf(path, sizeof path, "/sys/class/infiniband/%s/ports/%u/cm_rx_duplicates/dreq",
             ibv_get_device_name(id->verbs->device), id->port_num);
    FILE *f = fopen(path, "r");
    if (!f) { out("ERROR open %s: %s", path, strerror(errno)); return -1; }
    if (fscanf(f, "%ld", &v) != 1) v = -1;
    fclose(f);
    return v;
}

static int server(void) {
    struct rdma_event_channel *ch = rdma_create_event_channel();
    struct rdma_cm_id *lid;
    if (!ch) { out("ERROR rdma_create_event_channel: %s", strerror(errno)); return result(0); }
    if (o.xrc) {
        if (!(lid = xrc_ep(ch, 1))) return result(0);
    } else {
        struct sockaddr_storage ss;
        struct sockaddr_in *sa = (struct sockaddr_in *)&ss;
        struct sockaddr_in6 *sa6 = (struct sockaddr_in6 *)&ss;
        memset(&ss, 0, sizeof ss);
        if (o.bind && strchr(o.bind, ':')) {
            sa6->sin6_family = AF_INET6;
            sa6->sin6_port = htons(o.port);
            if (inet_pton(AF_INET6, o.bind, &sa6->sin6_addr) != 1) { out("ERROR bad --bind %s", o.bind); return result(0); }
        } else {
            sa->sin_family = AF_INET;
            sa->sin_port = htons(o.port);
            if (o.bind && inet_pton(AF_INET, o.bind, &sa->sin_addr) != 1) { out("ERROR bad --bind %s", o.bind); return result(0); }
        }
        if (rdma_create_id(ch, &lid, NULL, o.ps)) { out("ERROR rdma_create_id: %s", strerror(errno)); return result(0); }
        if (rdma_bind_addr(lid, (struct sockaddr *)&ss)) { out("ERROR rdma_bind_addr: %s", strerror(errno)); return result(0); }
    }
    if (rdma_listen(lid, 64)) { out("ERROR rdma_listen: %s", strerror(errno)); return result(0); }
    out("LISTEN port=%d ps=%s qp=%s", o.port, ps_name(), o.xrc ? "xrc" : "rc");

    struct conn c[MAXC];
    memset(c, 0, sizeof c);
    int handled = 0, open = 0;
    long long deadline = now_ms() + o.timeout_ms;
    while (now_ms() < deadline) {
        if (handled >= o.count && open == 0) break;
        for (int i = 0; i < MAXC; i++)           /* disconnects due on this side */
            if (c[i].state == 2 && should_disconnect(c[i].est_at)) {
                out("ACTION DISCONNECT conn=%d", i);
                if (rdma_disconnect(c[i].id)) { out("ERROR rdma_disconnect: %s", strerror(errno)); n.errors++; }
                c[i].state = 3;
            }
        struct rdma_cm_event *ev = next_event(ch, 50);
        if (!ev) continue;
        struct rdma_cm_id *id = ev->id;
        int k;
        for (k = 0; k < MAXC && !(c[k].state && c[k].id == id); k++) ;
        switch (ev->event) {
        case RDMA_CM_EVENT_CONNECT_REQUEST: {
            n.requests++;
            print_peer(id);
            rdma_ack_cm_event(ev);
            int idx = handled++;
            for (k = 0; k < MAXC && c[k].state; k++) ;
            if (k == MAXC || idx >= o.count) { rdma_reject(id, NULL, 0); rdma_destroy_id(id); out("ACTION REJECT surplus"); continue; }
            if (o.reject) {
                out("ACTION REJECT pd=%s", hex_trim(o.pd, o.pdlen));
                if (rdma_reject(id, o.pdlen ? o.pd : NULL, o.pdlen)) { out("ERROR rdma_reject: %s", strerror(errno)); n.errors++; }
                n.rejected++;
                rdma_destroy_id(id);
                continue;
            }
            if (o.accept_delay > 0) { out("ACTION DELAY ms=%d", o.accept_delay); usleep(o.accept_delay * 1000); }
            if (!o.no_qp && make_qp(id)) { n.errors++; rdma_reject(id, NULL, 0); rdma_destroy_id(id); continue; }
            struct rdma_conn_param cp;
            fill_param(&cp, o.apd, o.apdlen, idx);
            if (rdma_accept(id, &cp)) { out("ERROR rdma_accept: %s", strerror(errno)); n.errors++; destroy(id); continue; }
            out("ACTION ACCEPT conn=%d qpn=0x%x", k, id->qp ? id->qp->qp_num : cp.qp_num);
            c[k].id = id; c[k].state = 1; open++;
            continue;
        }
        case RDMA_CM_EVENT_ESTABLISHED:
            n.established++;
            if (k < MAXC) { c[k].state = 2; c[k].est_at = now_ms(); }
            break;
        case RDMA_CM_EVENT_DISCONNECTED:
            n.disconnected++;
            if (k < MAXC && c[k].state == 2) rdma_disconnect(id);   /* peer's DREQ: answer DREP */
            rdma_ack_cm_event(ev);
            if (k < MAXC && o.hold_timewait) {
                c[k].dup_dreq = dreq_duplicates(id);
                c[k].state = 4;
                out("TIMEWAIT-ENTER conn=%d dreq_duplicates=%ld", k, c[k].dup_dreq);
                continue;
            }
            if (k < MAXC) { destroy(id); c[k].state = 0; open--; }
            continue;
        case RDMA_CM_EVENT_TIMEWAIT_EXIT:
            rdma_ack_cm_event(ev);
            if (k < MAXC && c[k].state == 4) {
                long d = dreq_duplicates(id);
                out("TIMEWAIT-EXIT conn=%d dreq_duplicates=%ld in_timewait=%ld", k, d,
                    d >= 0 && c[k].dup_dreq >= 0 ? d - c[k].dup_dreq : -1);
                n.timewait_exits++;
                destroy(id); c[k].state = 0; open--;
            }
            continue;
        case RDMA_CM_EVENT_REJECTED:
            n.rejected++;
            rdma_ack_cm_event(ev);
            if (k < MAXC) { destroy(id); c[k].state = 0; open--; }
            continue;
        case RDMA_CM_EVENT_UNREACHABLE:
        case RDMA_CM_EVENT_CONNECT_ERROR:
            n.unreachable++;
            rdma_ack_cm_event(ev);
            if (k < MAXC) { destroy(id); c[k].state = 0; open--; }
            continue;
        default:
            break;
        }
        rdma_ack_cm_event(ev);
    }
    int ok = handled >= o.count && open == 0 && !n.errors;
    if (!strcmp(o.expect, "rejected") && !o.reject) ok = ok && n.rejected == o.count;
    else if (!strcmp(o.expect, "unreachable")) ok = ok && n.unreachable == o.count;
    else if (!o.reject) ok = ok && n.established == o.count && n.disconnected == o.count;
    if (o.hold_timewait) ok = ok && n.timewait_exits == o.count;
    if (handled < o.count) out("ERROR timeout: %d of %d requests seen", handled, o.count);
    rdma_destroy_id(lid);
    rdma_destroy_event_channel(ch);
    return result(ok);
}

/* ---------------------------------------------------------------------------------------- */
static struct rdma_cm_event *expect_ev(struct rdma_event_channel *ch, enum rdma_cm_event_type want) {
    struct rdma_cm_event *ev = next_event(ch, -1);
    if (!ev) { out("ERROR timeout waiting for %s", ev_name(want)); return NULL; }
    if (ev->event != want) { rdma_ack_cm_event(ev); return NULL; }
    return ev;
}

/* a resolved id (addr + route), ready for rdma_connect */
static struct rdma_cm_id *client_id(struct rdma_event_channel *ch) {
    struct rdma_cm_id *id;
    struct rdma_cm_event *ev;
    if (o.xrc) return xrc_ep(ch, 0);
    struct addrinfo *dst, *src = NULL, h = { .ai_family = AF_UNSPEC };
    char port[16];
    snprintf(port, sizeof port, "%d", o.port);
    if (getaddrinfo(o.addr, port, &h, &dst)) { out("ERROR bad --addr %s", o.addr); return NULL; }
    if (o.src && getaddrinfo(o.src, NULL, &h, &src)) { out("ERROR bad --src %s", o.src); return NULL; }
    if (rdma_create_id(ch, &id, NULL, o.ps)) { out("ERROR rdma_create_id: %s", strerror(errno)); return NULL; }
    if (rdma_resolve_addr(id, src ? src->ai_addr : NULL, dst->ai_addr, 2000)) { out("ERROR rdma_resolve_addr: %s", strerror(errno)); return NULL; }
    freeaddrinfo(dst);
    if (src) freeaddrinfo(src);
    if (!(ev = expect_ev(ch, RDMA_CM_EVENT_ADDR_RESOLVED))) return NULL;
    rdma_ack_cm_event(ev);
    if (o.ack_timeout >= 0) {
        uint8_t t = o.ack_timeout;
        if (rdma_set_option(id, RDMA_OPTION_ID, RDMA_OPTION_ID_ACK_TIMEOUT, &t, sizeof t))
            out("ERROR rdma_set_option(ACK_TIMEOUT): %s", strerror(errno));
    }
    if (rdma_resolve_route(id, 2000)) { out("ERROR rdma_resolve_route: %s", strerror(errno)); return NULL; }
    if (!(ev = expect_ev(ch, RDMA_CM_EVENT_ROUTE_RESOLVED))) return NULL;
    rdma_ack_cm_event(ev);
    return id;
}

static int client_connect(struct rdma_cm_id *id, int idx) {
    if (!o.no_qp && make_qp(id)) return -1;
    struct rdma_conn_param cp;
    fill_param(&cp, o.pd, o.pdlen, idx);
    out("ACTION CONNECT conn=%d qpn=0x%x pd=%s", idx, id->qp ? id->qp->qp_num : cp.qp_num, hex_trim(o.pd, o.pdlen));
    if (rdma_connect(id, &cp)) { out("ERROR rdma_connect: %s", strerror(errno)); return -1; }
    return 0;
}

/* CONNECT_RESPONSE (no QP): reject the REP, or send the RTU (after --establish-delay);
 * -> the event the connection is now at (ESTABLISHED, REJECTED) or -1 */
static int client_response(struct rdma_cm_id *id) {
    if (o.reject_rep) {
        out("ACTION REJECT-REP pd=%s", hex_trim(o.rpd, o.rpdlen));
        if (rdma_reject(id, o.rpdlen ? o.rpd : NULL, o.rpdlen)) { out("ERROR rdma_reject: %s", strerror(errno)); return -1; }
        return RDMA_CM_EVENT_REJECTED;
    }
    if (o.establish_delay > 0) { out("ACTION DELAY-RTU ms=%d", o.establish_delay); usleep(o.establish_delay * 1000); }
    out("ACTION ESTABLISH (rdma_establish sends the RTU)");
    if (rdma_establish(id)) { out("ERROR rdma_establish: %s", strerror(errno)); return -1; }
    return RDMA_CM_EVENT_ESTABLISHED;
}

static int client_one(struct rdma_event_channel *ch, int idx) {
    struct rdma_cm_id *id;
    struct rdma_cm_event *ev;
    if (!(id = client_id(ch))) return -1;
    if (client_connect(id, idx)) { destroy(id); return -1; }
    /* outcome: ESTABLISHED, REJECTED, UNREACHABLE, CONNECT_ERROR (the kernel retries the REQ
     * up to 15 times, ~100 s, before UNREACHABLE: keep --timeout generous for that) */
    ev = next_event(ch, -1);
    if (!ev) {
        if (!strcmp(o.expect, "gaveup")) {
            /* destroying an id in REQ_SENT / MRA_REQ_RCVD: the kernel sends REJ 4 + ARI */
            out("ACTION GIVE-UP conn=%d (rdma_destroy_id while connecting)", idx);
            n.gaveup++;
            destroy(id);
            return 0;
        }
        out("ERROR timeout waiting for the connect outcome");
        destroy(id);
        return -1;
    }
    int e = ev->event;
    rdma_ack_cm_event(ev);
    if (e == RDMA_CM_EVENT_CONNECT_RESPONSE && (e = client_response(id)) < 0) { destroy(id); return -1; }
    if (e == RDMA_CM_EVENT_REJECTED) { n.rejected++; destroy(id); return 0; }
    if (e != RDMA_CM_EVENT_ESTABLISHED) { n.unreachable++; destroy(id); return 0; }
    n.established++;
    long long est = now_ms(), deadline = est + o.timeout_ms;
    int sent = 0;
    while (now_ms() < deadline) {
        if (!sent && wants_disconnect() && should_disconnect(est)) {
            out("ACTION DISCONNECT conn=%d", idx);
            if (rdma_disconnect(id)) { out("ERROR rdma_disconnect: %s", strerror(errno)); n.errors++; }
            sent = 1;
        }
        ev = next_event(ch, 50);
        if (!ev) continue;
        e = ev->event;
        rdma_ack_cm_event(ev);
        if (e == RDMA_CM_EVENT_DISCONNECTED) {
            n.disconnected++;
            if (!sent) rdma_disconnect(id);                        /* answer the peer's DREQ */
            destroy(id);
            return 0;
        }
    }
    out("ERROR timeout waiting for DISCONNECTED");
    destroy(id);
    return -1;
}

/* --stale: hold connection 0, then connect 1 with the same QPN */
static int client_stale(struct rdma_event_channel *ch) {
    struct rdma_cm_id *id0, *id1;
    struct rdma_cm_event *ev;
    if (!(id0 = client_id(ch)) || client_connect(id0, 0)) return -1;
    if (!(ev = next_event(ch, -1))) { out("ERROR timeout waiting for connection 0"); return -1; }
    int e = ev->event;
    rdma_ack_cm_event(ev);
    if (e == RDMA_CM_EVENT_CONNECT_RESPONSE) e = client_response(id0);
    if (e != RDMA_CM_EVENT_ESTABLISHED) { out("ERROR connection 0 not established"); return -1; }
    n.established++;
    out("HOLD conn=0; connecting conn=1 with the same QPN");
    if (!(id1 = client_id(ch)) || client_connect(id1, 1)) return -1;
    int rej1 = 0, disc0 = 0;
    long long deadline = now_ms() + o.timeout_ms;
    while ((!rej1 || !disc0) && now_ms() < deadline) {
        if (!(ev = next_event(ch, 50))) continue;
        struct rdma_cm_id *id = ev->id;
        e = ev->event;
        int st = ev->status;
        rdma_ack_cm_event(ev);
        if (id == id1 && e == RDMA_CM_EVENT_REJECTED) {
            out("CONN 1 REJECTED status=%d", st);
            n.rejected++;
            rej1 = 1;
        } else if (id == id1) {
            out("ERROR connection 1: %s", rdma_event_str(e));
            return -1;
        } else if (id == id0 && e == RDMA_CM_EVENT_DISCONNECTED) {
            out("CONN 0 DISCONNECTED");
            n.disconnected++;
            rdma_disconnect(id0);
            disc0 = 1;
        }
    }
    destroy(id1);
    destroy(id0);
    if (!rej1 || !disc0) { out("ERROR timeout: conn 1 rejected=%d, conn 0 disconnected=%d", rej1, disc0); return -1; }
    return 0;
}

static int client(void) {
    struct rdma_event_channel *ch = rdma_create_event_channel();
    if (!ch) { out("ERROR rdma_create_event_channel: %s", strerror(errno)); return result(0); }
    out("CONNECT addr=%s port=%d ps=%s qp=%s count=%d", o.addr, o.port, ps_name(), o.xrc ? "xrc" : "rc", o.count);
    if (o.stale) {
        if (client_stale(ch)) n.errors++;
        rdma_destroy_event_channel(ch);
        return result(!n.errors && n.established == 1 && n.rejected == 1 && n.disconnected == 1);
    }
    for (int i = 0; i < o.count; i++)
        if (client_one(ch, i)) n.errors++;
    int ok = !n.errors;
    if (!strcmp(o.expect, "established")) ok = ok && n.established == o.count && n.disconnected == o.count;
    else if (!strcmp(o.expect, "rejected")) ok = ok && n.rejected == o.count;
    else if (!strcmp(o.expect, "unreachable")) ok = ok && n.unreachable == o.count;
    else if (!strcmp(o.expect, "gaveup")) ok = ok && n.gaveup == o.count;
    rdma_destroy_event_channel(ch);
    return result(ok);
}

static int mark(const char *addr, const char *text) {
    int s = socket(AF_INET, SOCK_DGRAM, 0);
    struct sockaddr_in a = { .sin_family = AF_INET, .sin_port = htons(9) };
    if (s < 0 || inet_pton(AF_INET, addr, &a.sin_addr) != 1) return 1;
    return sendto(s, text, strlen(text), 0, (struct sockaddr *)&a, sizeof a) < 0;
}

static void usage(void) {
    fprintf(stderr,
        "usage: cmpeer server --port P [--bind A] [--accept|--reject-pd HEX] [--accept-delay MS] [--no-qp]\n"
        "                     [--accept-pd HEX] [--disconnect-after MS] [--disconnect-on FILE]\n"
        "                     [--ps tcp|ib] [--qp rc|xrc] [--count N] [--timeout MS] [--expect established|rejected|unreachable]\n"
        "                     [--hold-timewait]\n"
        "       cmpeer client --addr A --port P [--src A] [--pd HEX] [--count N] [--no-qp]\n"
        "                     [--disconnect-after MS] [--disconnect-on FILE] [--ps tcp|ib] [--qp rc|xrc]\n"
        "                     [--ack-timeout N] [--expect established|rejected|unreachable|gaveup] [--timeout MS]\n"
        "                     [--establish-delay MS] [--reject-rep HEX] [--same-qpn] [--stale]\n"
        "       cmpeer mark ADDR TEXT\n");
    exit(2);
}

int main(int argc, char **argv) {
    if (argc < 2) usage();
    if (!strcmp(argv[1], "mark")) return argc < 4 ? 2 : mark(argv[2], argv[3]);
    if (!strcmp(argv[1], "server")) o.server = 1;
    else if (strcmp(argv[1], "client")) usage();
    static struct option lo[] = {
        {"port", 1, 0, 'p'}, {"bind", 1, 0, 'b'}, {"accept", 0, 0, 'A'}, {"reject-pd", 1, 0, 'R'},
        {"accept-delay", 1, 0, 'D'}, {"no-qp", 0, 0, 'N'}, {"accept-pd", 1, 0, 'P'},
        {"disconnect-after", 1, 0, 'd'}, {"disconnect-on", 1, 0, 'f'}, {"ps", 1, 0, 's'},
        {"qp", 1, 0, 'q'}, {"count", 1, 0, 'c'}, {"timeout", 1, 0, 't'}, {"addr", 1, 0, 'a'},
        {"src", 1, 0, 'S'}, {"pd", 1, 0, 'x'}, {"ack-timeout", 1, 0, 'T'}, {"expect", 1, 0, 'e'},
        {"establish-delay", 1, 0, 'E'}, {"reject-rep", 1, 0, 'J'}, {"same-qpn", 0, 0, 'Q'},
        {"stale", 0, 0, 'Z'}, {"hold-timewait", 0, 0, 'W'}, {0, 0, 0, 0}};
    int ch;
    optind = 2;
    while ((ch = getopt_long(argc, argv, "", lo, NULL)) != -1) {
        switch (ch) {
        case 'p': o.port = atoi(optarg); break;
        case 'b': o.bind = optarg; break;
        case 'A': o.reject = 0; break;
        case 'R': o.reject = 1; o.pdlen = parse_hex(optarg, o.pd, 148); break;
        case 'D': o.accept_delay = atoi(optarg); break;
        case 'N': o.no_qp = 1; break;
        case 'P': o.apdlen = parse_hex(optarg, o.apd, 196); break;
        case 'd': o.disc_after = atoi(optarg); break;
        case 'f': o.disc_file = optarg; break;
        case 's': o.ps = !strcmp(optarg, "ib") ? RDMA_PS_IB : RDMA_PS_TCP; break;
        case 'q': o.xrc = !strcmp(optarg, "xrc"); break;
        case 'c': o.count = atoi(optarg); break;
        case 't': o.timeout_ms = atoi(optarg); break;
        case 'a': o.addr = optarg; break;
        case 'S': o.src = optarg; break;
        case 'x': o.pdlen = parse_hex(optarg, o.pd, 56); break;
        case 'T': o.ack_timeout = atoi(optarg); break;
        case 'e': o.expect = optarg; break;
        case 'E': o.establish_delay = atoi(optarg); break;
        case 'J': o.reject_rep = 1; o.rpdlen = parse_hex(optarg, o.rpd, 148); break;
        case 'Q': o.same_qpn = 1; break;
        case 'Z': o.stale = 1; o.no_qp = 1; o.same_qpn = 1; break;
        case 'W': o.hold_timewait = 1; break;
        default: usage();
        }
    }
    if (!o.port || (!o.server && !o.addr)) usage();
    if (o.xrc) { o.ps = RDMA_PS_IB; o.no_qp = 1; }     /* rxe has no XRC: CM only, no QP */
    if (o.count > MAXC) o.count = MAXC;
    return o.server ? server() : client();
}
