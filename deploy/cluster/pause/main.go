// Command pause is the process of the local cluster's pod sandboxes: it holds the pod's
// namespaces, reaps the orphans it inherits (it is PID 1 of a pod that shares its process
// namespace) and exits at SIGINT or SIGTERM. Built by `make cluster-deps`, packed into the
// sandbox image by rtserve.cluster.images.
package main

import (
	"os"
	"os/signal"
	"syscall"
)

func main() {
	signals := make(chan os.Signal, 8)
	signal.Notify(signals, syscall.SIGINT, syscall.SIGTERM, syscall.SIGCHLD)
	for sig := range signals {
		if sig != syscall.SIGCHLD {
			os.Exit(0)
		}
		for {
			var status syscall.WaitStatus
			if pid, err := syscall.Wait4(-1, &status, syscall.WNOHANG, nil); pid <= 0 || err != nil {
				break
			}
		}
	}
}
