/* hello.c -- proves that a normal (dynamically linked) host build runs in the guest. */
#include <gnu/libc-version.h>
#include <stdio.h>
#include <sys/utsname.h>
int main(void) {
    struct utsname u;
    uname(&u);
    printf("HELLO-C ok glibc=%s kernel=%s\n", gnu_get_libc_version(), u.release);
    return 0;
}
