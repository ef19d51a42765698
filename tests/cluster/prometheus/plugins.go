// Service discovery plugins of the Prometheus server built for the tests (tests/cluster/build.sh prometheus):
// this file replaces github.com/prometheus/prometheus/plugins/plugins.go through `go build -overlay`, so
// only Kubernetes service discovery is compiled in (plus the file and http plugins of plugins/minimum.go),
// not the cloud SDKs of every other discovery mechanism. Nothing else of Prometheus is changed.

package plugins

import (
	// Register kubernetes plugin.
	_ "github.com/prometheus/prometheus/discovery/kubernetes"
)
