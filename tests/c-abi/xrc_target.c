/*
 * xrc_target.c -- a C runtime as its own XRC target through the node's one registry (issue
 * 26 §2): a named domain shared by file, a TGT QP its creator serves, registered on, queried
 * and modified by other processes, and what each policy does when the creator dies.
 *
 *   xrc_target SERVER_SOCKET CLIENT_SOCKET SERVER_IP WORKDIR QPN_BASE
 *
 * For each policy (explicit, domain, process, shared), four processes:
 *   - the creator (job 1): opens the domain file WORKDIR/job1-POLICY.xrcd (IBCM_XRCD_CREATE),
 *     creates a TGT QP with the policy and serves an XRC service with it
 *     (ibcm_xrc_listen_domain), then waits to be killed;
 *   - a peer of the same job: opens the same file, registers on the QP by number, queries it
 *     (policy, creator's PID, registrations) and modifies it (a non-creator's
 *     ibv_modify_xrc_rcv_qp);
 *   - a process of another job: opens the same file under a name of its own and queries the QP;
 *   - the initiator (this process, on the other daemon): connects an XRC INI to the service;
 *     the REP names the creator's QP.
 * The runtime receives into its own SRQs (the sim backend's data path): the creator and the
 * peer each create an XRC SRQ in the shared domain (ibcm_xrc_srq_create), the service's REPs
 * announce the creator's; the initiator sends one message to each (ibcm_xrc_send: an XRC
 * SEND Only to the TGT QP, its XRCETH naming the SRQ) and each process takes its own
 * (ibcm_xrc_srq_recv). A third SEND names an SRQ the peer made in another domain: the TGT QP
 * refuses it (the counter xrc_data.srq_of_another_domain counts it) and that SRQ stays empty.
 * Then the creator is SIGKILLed, and docs/xrc.md §8.2's creator-exit column must hold:
 *   explicit: the QP stays, an orphan (owner 0); the peer, of the owner's uid, destroys it and
 *             the initiator hears "target gone (owner destroyed it)";
 *   domain:   the QP stays (the peer still holds the domain), and after the peer's
 *             unregister (a registration owns nothing) until the initiator disconnects;
 *   process:  the QP is released: the initiator's DISCONNECTED says "creator exited", the peer
 *             is told (XRC_REPORT, IBCM_XRC_QP_GONE) and queries it gone;
 *   shared:   the creator's registration is dropped, the peer's keeps the QP; when the peer
 *             unregisters, the last registration is gone and so is the QP ("last
 *             registration dropped" at the initiator).
 * Prints "checked: ..." lines and one "torn down: ..." per connection; exits 1 on any failure.
 */
#include "example.h"

#include <signal.h>
#include <sys/prctl.h>
#include <sys/wait.h>
#include <unistd.h>

static const char *policy_name[] = {"explicit", "domain", "process", "shared"};

/* Writes one number to a pipe. */
static void tell(int fd, uint32_t v)
{
    if (write(fd, &v, sizeof v) != (ssize_t)sizeof v)
        fail("%s", "pipe write");
}

/* Reads one number from a pipe (fails when the writer died first). */
static uint32_t hear(int fd)
{
    uint32_t v;
    if (read(fd, &v, sizeof v) != (ssize_t)sizeof v)
        fail("%s", "pipe read: the other process died");
    return v;
}

/* The message the initiator sends to `who`'s SRQ under `policy`. */
static void message(char *buf, size_t len, const char *who, int policy)
{
    snprintf(buf, len, "to the %s's own SRQ (%s)", who, policy_name[policy]);
}

/* Takes one message from SRQ `srqn` of `c` (waiting up to 5 s) and checks it is `want`. */
static void receive_one(struct ibcm_ctx *c, uint32_t srqn, const char *who, const char *want)
{
    static uint8_t buf[IBCM_XRC_MESSAGE_MAX];
    uint32_t n = 0;
    for (int i = 0; i < 5000; i++) {
        int rc = ibcm_xrc_srq_recv(c, srqn, buf, sizeof buf, &n);
        if (rc == IBCM_OK) {
            if (n != strlen(want) || memcmp(buf, want, n) != 0)
                fail("%s: SRQ received something else", who);
            printf("checked: the %s received \"%.*s\" in its SRQ %#x\n", who, (int)n, buf, srqn);
            fflush(stdout);
            return;
        }
        if (rc != IBCM_EAGAIN)
            check(rc, "ibcm_xrc_srq_recv");
        usleep(1000);
    }
    fail("%s: no message in its SRQ after 5 s", who);
}

/* The node service's counter `name` (0 when it has none yet). */
static uint64_t counter(struct ibcm_ctx *c, const char *name)
{
    static struct ibcm_counter cs[256];
    uint32_t n = 0;
    check(ibcm_query_counters(c, cs, 256, &n), "ibcm_query_counters");
    for (uint32_t i = 0; i < n && i < 256; i++)
        if (strcmp(cs[i].name, name) == 0)
            return cs[i].value;
    return 0;
}

/* The creator: domain, QP, its own SRQ, service; reports the QPN and SRQ number, takes the
 * initiator's message, then waits to be killed. */
static void creator(const char *sock, const char *path, int policy, uint64_t sid, int out,
                    int in)
{
    struct ibcm_ctx *c;
    uint32_t qpn, srqn;
    char want[128];
    check(ibcm_open(sock, &c), "creator: ibcm_open");
    check(ibcm_xrcd_open(c, "job1", path, IBCM_XRCD_CREATE), "creator: ibcm_xrcd_open");
    check(ibcm_xrc_tgt_create(c, "job1", policy, &qpn), "creator: ibcm_xrc_tgt_create");
    check(ibcm_xrc_srq_create(c, "job1", 0, &srqn), "creator: ibcm_xrc_srq_create");
    check(ibcm_xrc_listen_domain(c, sid, policy, &srqn, 1, "job1", qpn),
          "creator: ibcm_xrc_listen_domain");
    tell(out, qpn);
    tell(out, srqn);
    hear(in); /* the initiator has sent */
    message(want, sizeof want, "creator", policy);
    receive_one(c, srqn, "creator", want);
    tell(out, 1);
    for (;;)
        pause();
}

/* The peer of the same job: registers on the QP, queries and modifies it; then, told by the
 * parent, checks the QP after the creator's death and cleans up. */
static void peer(const char *sock, const char *path, int policy, uint32_t qpn, int creator_pid,
                 int in, int out)
{
    struct ibcm_ctx *c;
    struct ibcm_xrc_tgt_info info;
    check(ibcm_open(sock, &c), "peer: ibcm_open");
    int rc = ibcm_xrcd_open(c, "mine", "/nonexistent/ibcm-xrcd", 0);
    if (rc != IBCM_ENOENT)
        fail("peer: a domain file that names no domain, without IBCM_XRCD_CREATE: %s",
             rc == IBCM_OK ? "IBCM_OK" : ibcm_last_error());
    check(ibcm_xrcd_open(c, "job1", path, 0), "peer: ibcm_xrcd_open (the creator's file)");
    check(ibcm_xrc_tgt_register(c, qpn), "peer: ibcm_xrc_tgt_register");
    check(ibcm_xrc_tgt_query(c, qpn, &info), "peer: ibcm_xrc_tgt_query");
    if (info.qpn != qpn || info.policy != policy || !info.live ||
        info.creator_pid != (uint32_t)creator_pid || info.registrations < 1)
        fail("%s", "peer: the query does not show the creator's QP with this registration");
    /* A non-creator's modify: the new QP from RESET to INIT (state, P_Key index, port,
     * access flags), as a runtime brings up its receive QP; the CM takes it on from there. */
    struct ibcm_qp_attr a;
    memset(&a, 0, sizeof a);
    a.qp_state = IBCM_QPS_INIT;
    a.pkey_index = 0;
    a.port_num = 1;
    a.qp_access_flags = 1 | 2 | 4; /* IBV_ACCESS_LOCAL_WRITE | REMOTE_WRITE | REMOTE_READ */
    int was = (int)info.qp_state;
    if (was == 0) {
        check(ibcm_xrc_tgt_modify(c, qpn, &a, (1 << 0) | (1 << 3) | (1 << 4) | (1 << 5)),
              "peer: ibcm_xrc_tgt_modify (RESET -> INIT)");
        check(ibcm_xrc_tgt_query(c, qpn, &info), "peer: ibcm_xrc_tgt_query (after modify)");
        if (info.qp_state != IBCM_QPS_INIT)
            fail("%s", "peer: the QP is not in INIT after the peer's modify");
    }
    a.min_rnr_timer = 12;
    if (ibcm_xrc_tgt_modify(c, qpn, &a, 1 << 15) != IBCM_EINVAL)
        fail("%s", "peer: a modify the QP's state refuses (MIN_RNR_TIMER alone) was not IBCM_EINVAL");
    a.qp_state = 9;
    if (ibcm_xrc_tgt_modify(c, qpn, &a, 1) != IBCM_EINVAL)
        fail("%s", "peer: a modify to QP state 9 was not IBCM_EINVAL");
    printf("checked: %s: a peer process registered on TGT QP %#x, queried it (creator pid %u, "
           "%u registration(s)) and modified it (state %d -> %u)\n", policy_name[policy], qpn,
           info.creator_pid, info.registrations, was, info.qp_state);
    fflush(stdout);
    /* Its own SRQ in the job's domain, and one in a domain of its own (another file). */
    uint32_t srqn, srqn_other;
    char other[600], want[128];
    snprintf(other, sizeof other, "%s.other", path);
    check(ibcm_xrc_srq_create(c, "job1", 4, &srqn), "peer: ibcm_xrc_srq_create");
    check(ibcm_xrcd_open(c, "elsewhere", other, IBCM_XRCD_CREATE), "peer: ibcm_xrcd_open (other)");
    check(ibcm_xrc_srq_create(c, "elsewhere", 4, &srqn_other),
          "peer: ibcm_xrc_srq_create (other domain)");
    uint64_t refused = counter(c, "xrc_data.srq_of_another_domain");
    tell(out, 1);
    tell(out, srqn);
    tell(out, srqn_other);
    hear(in); /* the initiator has sent */
    message(want, sizeof want, "peer", policy);
    receive_one(c, srqn, "peer", want);
    for (int i = 0; counter(c, "xrc_data.srq_of_another_domain") == refused; i++) {
        if (i == 5000)
            fail("%s", "peer: the SEND to another domain's SRQ was not refused in 5 s");
        usleep(1000);
    }
    uint8_t buf[IBCM_XRC_MESSAGE_MAX];
    uint32_t n;
    rc = ibcm_xrc_srq_recv(c, srqn_other, buf, sizeof buf, &n);
    if (rc != IBCM_EAGAIN)
        fail("peer: the SRQ of another domain: %s", rc == IBCM_OK ? "received" : ibcm_last_error());
    printf("checked: %s: a SEND naming an SRQ of another domain was refused (%s), not received\n",
           policy_name[policy], "xrc_data.srq_of_another_domain");
    fflush(stdout);
    tell(out, 3);
    hear(in); /* the creator is dead and the initiator has seen what it sees */
    check(ibcm_xrc_tgt_query(c, qpn, &info), "peer: ibcm_xrc_tgt_query (after the creator)");
    if (policy == IBCM_XRC_PROCESS) {
        struct ibcm_event *ev;
        int gone = 0;
        while (!gone) {
            check(ibcm_wait_event(c, 10000, &ev), "peer: waiting for the QP-gone report");
            gone = ev->event == IBCM_EVENT_XRC_REPORT && ev->xrc_report == IBCM_XRC_QP_GONE &&
                   ev->remote_qpn == qpn;
            ibcm_ack_event(c, ev);
        }
        check(ibcm_xrc_tgt_query(c, qpn, &info), "peer: ibcm_xrc_tgt_query (gone)");
        if (info.live)
            fail("%s", "peer: the process-bound QP lives after its creator");
        printf("checked: process: the peer was told the QP is gone and queries it gone (%s)\n",
               info.reason);
    } else {
        if (!info.live)
            fail("peer: the %s QP is gone after its creator exited", policy_name[policy]);
        if (policy == IBCM_XRC_EXPLICIT) {
            if (info.owner_pid != 0)
                fail("%s", "peer: the explicit QP still has an owner after its creator died");
            check(ibcm_xrc_tgt_destroy(c, qpn), "peer: ibcm_xrc_tgt_destroy (the orphan)");
            printf("checked: explicit: an orphan after its creator died; destroyed by the peer\n");
        } else {
            printf("checked: %s: the QP lives on after its creator (%u registration(s))\n",
                   policy_name[policy], info.registrations);
            check(ibcm_xrc_tgt_unregister(c, qpn), "peer: ibcm_xrc_tgt_unregister");
        }
    }
    fflush(stdout);
    check(ibcm_close(c), "peer: ibcm_close");
    tell(out, 2);
    exit(0);
}

/* The process of another job: opens the same domain file under its own name, queries. */
static void other_job(const char *sock, const char *path, uint32_t qpn, int out)
{
    struct ibcm_ctx *c;
    struct ibcm_xrc_tgt_info info;
    check(ibcm_open(sock, &c), "other job: ibcm_open");
    check(ibcm_xrcd_open(c, "job2-view", path, 0), "other job: ibcm_xrcd_open");
    check(ibcm_xrc_tgt_query(c, qpn, &info), "other job: ibcm_xrc_tgt_query");
    if (!info.live || info.qpn != qpn)
        fail("%s", "other job: the shared domain's QP");
    check(ibcm_close(c), "other job: ibcm_close");
    tell(out, 1);
    exit(0);
}

/* A pipe and a child process; the child dies with this process (so that a failure here
 * never leaves a child waiting for ever). */
static pid_t spawn_pipe(int fds[2])
{
    if (pipe(fds) != 0)
        fail("%s", "pipe");
    fflush(stdout);
    pid_t parent = getpid();
    pid_t pid = fork();
    if (pid == 0 && (prctl(PR_SET_PDEATHSIG, SIGKILL) != 0 || getppid() != parent))
        exit(1);
    return pid;
}

int main(int argc, char **argv)
{
    if (argc != 6) {
        fprintf(stderr, "usage: xrc_target SERVER_SOCKET CLIENT_SOCKET SERVER_IP WORKDIR QPN_BASE\n");
        return 2;
    }
    const char *srv = argv[1], *cli = argv[2], *ip = argv[3], *dir = argv[4];
    uint32_t base = (uint32_t)strtoul(argv[5], NULL, 0);
    for (int policy = 0; policy < 4; policy++) {
        char path[512];
        snprintf(path, sizeof path, "%s/job1-%s.xrcd", dir, policy_name[policy]);
        uint64_t sid = 0x10000000c0de7200ULL + (uint64_t)policy;
        int cp[2], to_creator[2], to_peer[2], from_peer[2], op[2];
        if (pipe(to_creator) != 0)
            fail("%s", "pipe");
        pid_t cpid = spawn_pipe(cp);
        if (cpid == 0)
            creator(srv, path, policy, sid, cp[1], to_creator[0]);
        uint32_t qpn = hear(cp[0]);
        uint32_t srqn_creator = hear(cp[0]);
        if (pipe(to_peer) != 0)
            fail("%s", "pipe");
        pid_t ppid = spawn_pipe(from_peer);
        if (ppid == 0)
            peer(srv, path, policy, qpn, (int)cpid, to_peer[0], from_peer[1]);
        hear(from_peer[0]);
        uint32_t srqn_peer = hear(from_peer[0]);
        uint32_t srqn_other = hear(from_peer[0]);
        pid_t opid = spawn_pipe(op);
        if (opid == 0)
            other_job(srv, path, qpn, op[1]);
        hear(op[0]);
        waitpid(opid, NULL, 0);
        printf("checked: %s: a process of another job opened the domain file and queried TGT "
               "QP %#x\n", policy_name[policy], qpn);

        /* The initiator, on the other node. */
        struct ibcm_ctx *ini;
        check(ibcm_open(cli, &ini), "initiator: ibcm_open");
        struct ibcm_conn_param p;
        uint64_t h;
        check(ibcm_conn_param_init(&p), "ibcm_conn_param_init");
        p.peer = ip;
        p.service_id = sid;
        p.qp_num = base + (uint32_t)policy;
        p.transport = IBCM_TRANSPORT_XRC;
        check(ibcm_connect(ini, &p, &h), "initiator: ibcm_connect");
        struct ibcm_event *ev;
        check(ibcm_wait_event(ini, 10000, &ev), "initiator: waiting for ESTABLISHED");
        if (ev->event != IBCM_EVENT_ESTABLISHED || ev->remote_qpn != qpn)
            fail("initiator: %s instead of ESTABLISHED on the creator's QP", ibcm_event_str(ev->event));
        ibcm_ack_event(ini, ev);
        printf("established: xrc_target %s (ini qpn %#x -> the runtime's tgt qpn %#x)\n",
               policy_name[policy], p.qp_num, qpn);
        fflush(stdout);

        /* Data into the runtime's own SRQs: the creator's (the one the REP announced), the
         * peer's, then an SRQ of another domain, which the TGT QP must refuse. */
        char msg[128];
        message(msg, sizeof msg, "creator", policy);
        check(ibcm_xrc_send(ini, h, srqn_creator, (const uint8_t *)msg, (uint32_t)strlen(msg)),
              "initiator: ibcm_xrc_send (creator's SRQ)");
        message(msg, sizeof msg, "peer", policy);
        check(ibcm_xrc_send(ini, h, srqn_peer, (const uint8_t *)msg, (uint32_t)strlen(msg)),
              "initiator: ibcm_xrc_send (peer's SRQ)");
        check(ibcm_xrc_send(ini, h, srqn_other, (const uint8_t *)"x", 1),
              "initiator: ibcm_xrc_send (another domain's SRQ)");
        tell(to_creator[1], 1);
        if (hear(cp[0]) != 1)
            fail("%s", "the creator did not receive");
        tell(to_peer[1], 1);
        if (hear(from_peer[0]) != 3)
            fail("%s", "the peer did not receive");

        kill(cpid, SIGKILL);
        waitpid(cpid, NULL, 0);
        int rc = ibcm_wait_event(ini, 1500, &ev);
        if (policy == IBCM_XRC_PROCESS) {
            if (rc != IBCM_OK || ev->event != IBCM_EVENT_DISCONNECTED || !ev->target_gone ||
                !strstr(ev->reason, "creator exited"))
                fail("%s", "initiator: no DISCONNECTED saying \"creator exited\"");
            printf("torn down: xrc_target process: %s\n", ev->reason);
            ibcm_ack_event(ini, ev);
        } else if (rc != IBCM_EAGAIN) {
            fail("initiator: %s after the creator's death", ibcm_event_str(ev->event));
        }
        tell(to_peer[1], 1);
        if (hear(from_peer[0]) != 2)
            fail("%s", "the peer did not finish");
        waitpid(ppid, NULL, 0);
        if (policy == IBCM_XRC_EXPLICIT || policy == IBCM_XRC_SHARED) {
            /* explicit: the peer destroyed the orphan; shared: the peer's unregister dropped
             * the last registration (the connection holds none: the QP was the listener's) */
            const char *want = policy == IBCM_XRC_EXPLICIT ? "owner destroyed" : "last registration";
            check(ibcm_wait_event(ini, 10000, &ev), "initiator: waiting for the QP's end");
            if (ev->event != IBCM_EVENT_DISCONNECTED || !ev->target_gone || !strstr(ev->reason, want))
                fail("initiator: no DISCONNECTED saying \"%s\"", want);
            printf("torn down: xrc_target %s: %s\n", policy_name[policy], ev->reason);
            ibcm_ack_event(ini, ev);
        } else if (policy != IBCM_XRC_PROCESS) {
            check(ibcm_disconnect(ini, h, NULL, 0), "initiator: ibcm_disconnect");
            check(ibcm_wait_event(ini, 10000, &ev), "initiator: waiting for DISCONNECTED");
            if (ev->event != IBCM_EVENT_DISCONNECTED)
                fail("initiator: %s instead of DISCONNECTED", ibcm_event_str(ev->event));
            printf("torn down: xrc_target %s: %s\n", policy_name[policy], ev->reason);
            ibcm_ack_event(ini, ev);
        }
        check(ibcm_close(ini), "initiator: ibcm_close");
        fflush(stdout);
    }
    printf("xrc_target: the runtime's own TGT QPs held under every policy\n");
    return 0;
}
