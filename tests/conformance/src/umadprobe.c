/* umadprobe -- can a user-space CM own MAD class 0x07 on this node?
 *
 *   umadprobe [DEV] [LISTEN_SECS]
 *
 * Opens DEV (default /dev/infiniband/umad0), enables P_Key indexes (IB_USER_MAD_ENABLE_PKEY)
 * and registers an agent on QP1 for management class 0x07 (CM), class version 2, method
 * Send (0x03) -- what a user-space CM such as ibcm needs.  Prints
 *   UMADPROBE register class=0x07 ver=2 qpn=1: OK agent_id=N     (exit 0)
 *   UMADPROBE register ...: FAILED errno=E (...)                 (exit 1; e.g. ib_cm loaded)
 * then, for LISTEN_SECS seconds, one line per received MAD.  Static, no library needed. */
#include <errno.h>
#include <fcntl.h>
#include <poll.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/ioctl.h>
#include <time.h>
#include <unistd.h>
#include <arpa/inet.h>
#include <rdma/ib_user_mad.h>

int main(int argc, char **argv) {
    const char *dev = argc > 1 ? argv[1] : "/dev/infiniband/umad0";
    int secs = argc > 2 ? atoi(argv[2]) : 0;
    int fd = open(dev, O_RDWR);
    if (fd < 0) { printf("UMADPROBE open %s: FAILED errno=%d (%s)\n", dev, errno, strerror(errno)); return 1; }
    if (ioctl(fd, IB_USER_MAD_ENABLE_PKEY) < 0)
        printf("UMADPROBE enable_pkey: errno=%d (%s)\n", errno, strerror(errno));
    struct ib_user_mad_reg_req req;
    memset(&req, 0, sizeof req);
    req.qpn = 1;
    req.mgmt_class = 0x07;
    req.mgmt_class_version = 2;
    req.method_mask[0] = 1UL << 0x03;          /* every CM message uses method Send */
    if (ioctl(fd, IB_USER_MAD_REGISTER_AGENT, &req) < 0) {
        printf("UMADPROBE register class=0x07 ver=2 qpn=1 on %s: FAILED errno=%d (%s)\n", dev, errno, strerror(errno));
        return 1;
    }
    printf("UMADPROBE register class=0x07 ver=2 qpn=1 on %s: OK agent_id=%u\n", dev, req.id);
    fflush(stdout);
    time_t end = time(NULL) + secs;
    unsigned char buf[sizeof(struct ib_user_mad) + 256];
    while (secs > 0 && time(NULL) < end) {
        struct pollfd p = { .fd = fd, .events = POLLIN };
        if (poll(&p, 1, 200) <= 0) continue;
        ssize_t n = read(fd, buf, sizeof buf);
        if (n < (ssize_t)sizeof(struct ib_user_mad)) continue;
        struct ib_user_mad *m = (struct ib_user_mad *)buf;
        unsigned char *mad = (unsigned char *)m->data;
        char gid[64];
        inet_ntop(AF_INET6, m->hdr.gid, gid, sizeof gid);
        printf("UMADPROBE recv class=0x%02x method=0x%02x attr=0x%04x tid=0x%02x%02x%02x%02x%02x%02x%02x%02x from qpn=%u grh=%u gid=%s\n",
               mad[1], mad[3], mad[16] << 8 | mad[17], mad[8], mad[9], mad[10], mad[11], mad[12],
               mad[13], mad[14], mad[15], ntohl(m->hdr.qpn), m->hdr.grh_present, gid);
        fflush(stdout);
    }
    return 0;
}
