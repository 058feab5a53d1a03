/*
 * pause.c - the real node's pod sandbox process, and the real-node tests' workload.
 *
 * The kubelet's CRI runtime starts one sandbox ("pause") container per pod to hold
 * its namespaces; with no registry to pull registry.k8s.io/pause from, the tier
 * builds this instead (statically linked, so the image is this one file). It sleeps
 * until SIGINT or SIGTERM and reaps any child it inherits as a PID namespace's init.
 * The workload pods run it too: a process whose cgroup the agent attributes to its pod.
 */
#include <signal.h>
#include <stddef.h>
#include <sys/wait.h>
#include <unistd.h>

static void stop(int sig)
{
    (void)sig;
    _exit(0);
}

static void reap(int sig)
{
    (void)sig;
    while (waitpid(-1, NULL, WNOHANG) > 0) {
    }
}

int main(void)
{
    struct sigaction on_stop = {0};
    struct sigaction on_child = {0};

    on_stop.sa_handler = stop;
    sigaction(SIGINT, &on_stop, NULL);
    sigaction(SIGTERM, &on_stop, NULL);
    on_child.sa_handler = reap;
    on_child.sa_flags = SA_NOCLDSTOP;
    sigaction(SIGCHLD, &on_child, NULL);
    for (;;)
        pause();
}
