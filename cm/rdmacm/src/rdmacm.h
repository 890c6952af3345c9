/*
 * rdmacm.h -- internals of ibcm's librdmacm drop-in (librdmacm.so.1 over libibcm).
 *
 * The public face is rdma-core's own <rdma/rdma_cma.h> and <rdma/rdma_verbs.h>: this
 * library is compiled against them, so every structure an application sees
 * (struct rdma_cm_id, rdma_cm_event, rdma_conn_param, rdma_ud_param, rdma_event_channel,
 * rdma_addrinfo) has rdma-core's layout by construction. Under it is one libibcm session
 * per process (ibcm_open on the node service's socket), and libibverbs for the QPs.
 *
 * Files:
 *   session.c      the process's one ibcm session, fork, the errno of an ibcm status
 *   channel.c      event channels, the event queue, rdma_get_cm_event / rdma_ack_cm_event
 *   translate.c    ibcm events -> rdma_cm events (the connection's progress on each)
 *   id.c           rdma_cm_id: create, destroy, bind, listen, connect, accept, reject,
 *                  disconnect, establish, notify, migrate, options
 *   addr.c         local devices and addresses: resolve_addr / resolve_route,
 *                  rdma_get_devices, rdma_getaddrinfo
 *   qp.c           QPs, SRQs, CQs; the QP attributes of each transition
 *   ep.c           the synchronous API: rdma_create_ep, rdma_get_request, rdma_destroy_ep
 *   unsupported.c  multicast, ECE, rsockets: documented errors (docs/rdmacm.md §4)
 *
 * Locking: one process-wide mutex (rc_lock) guards every id, channel and queue; calls into
 * libibcm that wait for the daemon are made with it held only where the state they change
 * must not move meanwhile (they are bounded by the daemon's answer).
 */
#ifndef IBCM_RDMACM_H
#define IBCM_RDMACM_H

#include <pthread.h>
#include <stdint.h>
#include <sys/socket.h>
#include <sys/types.h>

#include <infiniband/verbs.h>
#include <rdma/rdma_cma.h>
#include <rdma/rdma_verbs.h>

#include <ibcm.h>

#define RC_EXPORT __attribute__((visibility("default")))

/* What a connection id is doing (the kernel's rdma_cm_state, as far as it is visible). */
enum rc_state {
	RC_IDLE,          /* created */
	RC_BOUND,         /* rdma_bind_addr */
	RC_ADDR_RESOLVED, /* rdma_resolve_addr (its event is queued at once) */
	RC_ROUTE_RESOLVED,
	RC_CONNECT,       /* REQ / SIDR_REQ sent, or a request received and not answered */
	RC_ACCEPTED,      /* passive: REP sent, RTU awaited */
	RC_ESTABLISHED,
	RC_LISTEN,
	RC_DISCONNECT,    /* DREQ sent or received */
	RC_CLOSED,        /* the connection's final event came */
};

struct rc_channel;
struct rc_event;

/* An opened device (one per device per process, shared by its ids, never closed). */
struct rc_device {
	struct ibv_context *verbs;
	struct ibv_pd *pd;             /* the default PD of rdma_create_qp(id, NULL, ...) */
	struct ibv_device_attr attr;
	struct rc_device *next;
};

/* An rdma_cm_id and what this library keeps for it. */
struct rc_id {
	struct rdma_cm_id id;          /* first: the application's pointer is this struct's */
	uint64_t key;                  /* the context pointer libibcm hands back (never reused) */
	struct rc_id *hnext;           /* the key table's chain */
	struct rc_channel *chan;
	struct rc_channel *own_chan;   /* the channel made for this synchronous id (freed with it) */
	pid_t pid;                     /* the process that made it (a fork child's copy: EBADF) */
	enum rc_state state;
	struct rc_device *dev;
	uint8_t sgid_index;            /* the local address's GID (RoCE v2 when there is one) */
	uint64_t conn;                 /* the libibcm handle (0: none) */
	uint64_t listen_sid;           /* a listener's service ID (0: not listening) */
	struct rc_id *listener;        /* a request's listener (until the request is answered) */
	struct ibcm_event *sidr_req;   /* a SIDR_REQUEST kept unacknowledged until answered */
	int sync;                      /* created without a channel: calls wait for their event */
	int destroyed;                 /* rdma_destroy_id called; freed once refs drop to 0 */
	int refs;                      /* the application's, events', handle's and requests' */
	int events_out;                /* events handed to the application, not acknowledged */
	int own_cqs;                   /* rdma_create_qp made the CQs and channels */
	int manual_establish;          /* active without a QP: CONNECT_RESPONSE to the app */
	int answered;                  /* passive: rdma_accept / rdma_reject was called */
	int rejected_here;             /* this side rejected: libibcm's CONNECT_ERROR is ours */
	int connect_error;             /* errno of a QP transition that failed at the REP */
	int auto_port;                 /* the bound port was drawn here (rdma_listen redraws it) */
	uint8_t ack_timeout;           /* RDMA_OPTION_ID_ACK_TIMEOUT (0: the CM's) */
	/* the request's / answer's parameters (CONNECT_REQUEST, REP) */
	uint8_t req_responder_resources, req_initiator_depth;
	uint8_t resp_res, init_depth;  /* what this side accepted / asked with */
	struct ibcm_accept_param accept;  /* passive: what rdma_accept sends (the PSN) */
	/* rdma_create_ep / rdma_get_request */
	struct ibv_qp_init_attr *ep_qp_attr;
	struct ibv_pd *ep_pd;
	struct ibv_sa_path_rec path;   /* route.path_rec points here once resolved */
};

/* An event as handed out: the application's struct first. */
struct rc_event {
	struct rdma_cm_event ev;
	struct rc_id *id;              /* ev.id's */
	struct rc_id *listener;        /* ev.listen_id's (holds a reference) */
	uint8_t private_data[256];
	struct rc_event *next;
};

struct rc_channel {
	struct rdma_event_channel ch;  /* first: ch.fd is an epoll fd over efd and libibcm's fd */
	int efd;                       /* eventfd: readable while the queue is not empty */
	struct rc_event *head, *tail;
	int sync_owned;                /* made for a synchronous id: its ids' calls wait */
	pid_t pid;                     /* the process that made it */
	int waiters;                   /* threads in rdma_get_cm_event's poll on it */
	int destroyed;                 /* rdma_destroy_event_channel: freed by its last waiter */
	struct rc_channel *next;
};

/* session.c */
extern pthread_mutex_t rc_lock;
extern pthread_cond_t rc_acked;                /* an event was acknowledged (rc_lock) */
struct ibcm_ctx *rc_session(void);            /* opens it on first use; NULL + errno */
int rc_session_fd(void);                      /* libibcm's event fd, -1 without a session */
int rc_errno(int ibcm_status);                /* an ibcm status as an errno value */
int rc_fail(int ibcm_status);                 /* errno = rc_errno(status); returns -1 */
int rc_err(int err);                          /* errno = err; returns -1 */
int rc_forked(void);                          /* this is a fork child of the session's owner */
void rc_trace(const char *fmt, ...) __attribute__((format(printf, 1, 2)));

/* channel.c */
struct rc_channel *rc_channel_new(int sync_owned);
void rc_channel_free(struct rc_channel *c);
struct rc_event *rc_event_new(struct rc_id *id, enum rdma_cm_event_type type, int status);
void rc_event_queue(struct rc_event *e);      /* onto e->id's channel; with rc_lock */
void rc_events_free(struct rc_event *e);      /* a list never handed out; with rc_lock */
void rc_channel_drained(struct rc_channel *c); /* its queue is empty: fd not readable */
void rc_event_queue_now(struct rc_id *id, enum rdma_cm_event_type type, int status);
int rc_wait_event(struct rc_channel *c, struct rc_event **out, int nonblock); /* rc_lock held */
void rc_pump(void);                           /* libibcm's events -> channels; with rc_lock */
int rc_sync_complete(struct rc_id *r, enum rdma_cm_event_type want);

/* translate.c */
void rc_translate(struct ibcm_event *ev);     /* with rc_lock; acknowledges ev (or keeps it) */

/* id.c */
struct rc_id *rc_id_find(uint64_t key);       /* NULL: unknown (destroyed and freed) */
struct rc_id *rc_id_new(struct rc_channel *c, void *context, enum rdma_port_space ps,
			enum ibv_qp_type qp_type);
void rc_id_put(struct rc_id *r);              /* drops a reference; frees a destroyed id */
struct rc_id *rc_id_of(struct rdma_cm_id *id);
int rc_usable(const struct rc_id *r);          /* 0, or -1 with EINVAL (NULL) / EBADF (fork) */
int rc_ps_qp_type(enum rdma_port_space ps, enum ibv_qp_type *qpt);
int rc_service_port(const struct rc_id *r);   /* the rdma_cm port of the id's address */
uint64_t rc_service_id(const struct rc_id *r, int dst);
uint16_t rc_ephemeral_port(void);             /* Linux's ip_local_port_range, at random */

/* addr.c */
int rc_addr_local(struct rc_id *r, const struct sockaddr *local);  /* device, port, GID */
int rc_sockaddr_len(const struct sockaddr *sa);
int rc_sockaddr_str(const struct sockaddr *sa, char *buf, size_t len, int with_port);
int rc_sockaddr_parse(const char *ipport, struct sockaddr_storage *ss);
void rc_ip_gid(const struct sockaddr *sa, union ibv_gid *gid);
struct rc_device *rc_device_of(struct ibv_context *verbs);
int rc_route_fill(struct rc_id *r, const struct ibv_port_attr *pa);

/* qp.c */
int rc_qp_to_init_local(struct rc_id *r, struct ibv_qp *qp);
int rc_qp_ud_ready(struct rc_id *r, struct ibv_qp *qp);
int rc_qp_modify_cm(struct rc_id *r, int state, const struct ibcm_accept_param *accept);
int rc_qp_error(struct rc_id *r);
void rc_ud_ah_attr(struct rc_id *r, struct ibv_ah_attr *ah);
struct ibcm_port rc_port(const struct rc_id *r);

#endif
