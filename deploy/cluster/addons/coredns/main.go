// Command coredns is the local cluster's DNS server: CoreDNS built with only the plugins a
// cluster DNS on one machine uses. rtserve/cluster/addons.py writes its Corefile.
//
// The cluster answers for its own names only (the cluster domain and the reverse zones); this
// machine reaches no outside resolver, so there is no forward plugin (nor loop, which guards
// forwarding): a name outside those zones is refused at once rather than timed out.
package main

import (
	"github.com/coredns/coredns/core/dnsserver"
	"github.com/coredns/coredns/coremain"

	_ "github.com/coredns/coredns/plugin/bind"
	_ "github.com/coredns/coredns/plugin/errors"
	_ "github.com/coredns/coredns/plugin/health"
	_ "github.com/coredns/coredns/plugin/kubernetes"
	_ "github.com/coredns/coredns/plugin/log"
	_ "github.com/coredns/coredns/plugin/ready"
)

// directives are the Corefile directives this build accepts, in the order a query passes
// through their plugins (CoreDNS chains them in this order, whatever order a Corefile uses).
var directives = []string{
	"bind",       // listen on the node's address only
	"ready",      // /ready on a loopback port: 200 once the kubernetes plugin has synced
	"health",     // /health on a loopback port: 200 while the process serves
	"errors",     // log the errors of the plugins below
	"log",        // log each query (when the Corefile asks for it)
	"kubernetes", // answer from the API server's Services and EndpointSlices
}

func main() {
	dnsserver.Directives = directives
	coremain.Run()
}
