#!/usr/bin/env bash
# node.sh up|down|env: a real single-node Kubernetes cluster on this machine, for end-to-end tests.
#
#   up    clean up any earlier node, then start etcd, kube-apiserver (service-account token issuance),
#         kube-controller-manager, kube-scheduler, containerd + runc, kubelet (CNI bridge networking)
#         and kube-proxy (iptables mode), import the images in NODE_IMAGES (and the pause image), and
#         wait until the node is Ready and the default ServiceAccount exists. Prints the kubeconfig.
#   down  stop everything up started and undo every change it made: processes, containers and their
#         shims, mounts, cgroups, iptables rules, the bridge, sysctls, the state directory. Safe to
#         run twice, and when nothing is running.
#   env   print the shell variables of the node (KUBECONFIG, NODE_IP, ...).
#
# Binaries: NODE_BIN (kubelet, kube-controller-manager, kube-scheduler, kube-proxy; `make node-binaries`)
# and ENVTEST_BIN (kube-apiserver, etcd; `make envtest`), both cached by version; containerd, runc,
# the CNI plugins, iptables and conntrack from Debian (.ci/run installs them).
#
# Networking exists only inside this machine: the node's address is the bridge's own address
# (NODE_IP), pods live in POD_CIDR on that bridge and get no default route and no nameserver, the
# Service range is routed onto the bridge, and forwarding is allowed only from the bridge to the
# bridge. Nothing is sent to an address this script did not create.
set -euo pipefail

root=$(cd "$(dirname "$0")/../.." && pwd)
NODE_DIR=${NODE_DIR:-/var/lib/limiterd-node}
LAST_LOGS=${LAST_LOGS:-/tmp/limiterd-node-logs}
NODE_NAME=limiterd-node
BRIDGE=limnode0
POD_CIDR=10.217.0.0/24
NODE_IP=10.217.0.1
SERVICE_CIDR=10.217.1.0/24
API_PORT=6443
ETCD_PORT=2479
CGROUP_ROOT=/limiterd-node
PAUSE_IMAGE=limiterd.local/pause:1
CNI_BIN=${CNI_BIN:-/usr/lib/cni}
FWD_CHAIN=LIMITERD-NODE-FORWARD
# The sysctls this script or the node's components (kubelet's kernel tunables, kube-proxy) may
# change; up saves them, down restores them.
SYSCTLS=(net.ipv4.ip_forward net.bridge.bridge-nf-call-iptables net.bridge.bridge-nf-call-ip6tables
	vm.overcommit_memory vm.panic_on_oom kernel.panic kernel.panic_on_oops kernel.keys.root_maxkeys
	kernel.keys.root_maxbytes net.ipv4.conf.all.route_localnet net.netfilter.nf_conntrack_max)

log() { printf 'node: %s\n' "$*" >&2; }
die() { log "$*"; exit 1; }

pki=$NODE_DIR/pki
run=$NODE_DIR/run
logs=$NODE_DIR/logs
containerd_sock=$NODE_DIR/containerd/containerd.sock
kubeconfig=$NODE_DIR/admin.kubeconfig

# ---------------------------------------------------------------------------------------------- down

# stop_pid <name>: SIGTERM the process recorded in run/<name>.pid, SIGKILL it after 10 s.
stop_pid() {
	local f=$run/$1.pid pid
	[ -f "$f" ] || return 0
	pid=$(cat "$f")
	if kill -0 "$pid" 2>/dev/null; then
		kill -TERM "$pid" 2>/dev/null || true
		for _ in $(seq 100); do kill -0 "$pid" 2>/dev/null || break; sleep 0.1; done
		kill -KILL "$pid" 2>/dev/null || true
	fi
	rm -f "$f"
}

# node_shims prints the pids of containerd shims serving this node's containerd (their command
# line names its socket, which is unique to this node).
node_shims() { pgrep -f -- "-address $containerd_sock( |\$)" || true; }

# iptables_clean <iptables|ip6tables>: remove the node's rules (KUBE-* chains of kubelet and
# kube-proxy, and this script's forwarding chain) from every table.
iptables_clean() {
	local ipt=$1 table chain rule
	command -v "$ipt" >/dev/null || return 0
	for table in filter nat mangle raw; do
		"$ipt" -t "$table" -S >/dev/null 2>&1 || continue
		# Rules in built-in chains that jump to a node chain.
		local rules
		rules=$("$ipt" -t "$table" -S | grep -E -- "-j (KUBE-|$FWD_CHAIN)" | grep -E '^-A (INPUT|OUTPUT|FORWARD|PREROUTING|POSTROUTING) ' || true)
		while read -r rule; do
			[ -n "$rule" ] || continue
			# shellcheck disable=SC2086 # the rule is re-split into its words on purpose
			"$ipt" -t "$table" ${rule/-A /-D } 2>/dev/null || true
		done <<<"$rules"
		for chain in $("$ipt" -t "$table" -S | sed -nE "s/^-N ((KUBE-|$FWD_CHAIN)[^ ]*)$/\\1/p"); do
			"$ipt" -t "$table" -F "$chain" 2>/dev/null || true
		done
		for chain in $("$ipt" -t "$table" -S | sed -nE "s/^-N ((KUBE-|$FWD_CHAIN)[^ ]*)$/\\1/p"); do
			"$ipt" -t "$table" -X "$chain" 2>/dev/null || true
		done
	done
}

down() {
	[ -d "$NODE_DIR" ] || { cleanup_host; return 0; }
	log "stopping the node in $NODE_DIR"
	# The control plane first, so that nothing restarts pods while they are stopped.
	stop_pid kube-controller-manager
	stop_pid kube-scheduler
	stop_pid kube-proxy
	stop_pid kubelet
	# Every container and sandbox, then containerd, then any shim left.
	if [ -S "$containerd_sock" ] && command -v ctr >/dev/null; then
		local id
		for id in $(ctr -a "$containerd_sock" -n k8s.io tasks ls -q 2>/dev/null); do
			ctr -a "$containerd_sock" -n k8s.io tasks kill -s SIGKILL "$id" >/dev/null 2>&1 || true
		done
		for _ in $(seq 50); do
			[ -z "$(ctr -a "$containerd_sock" -n k8s.io tasks ls -q 2>/dev/null | head -1)" ] && break
			for id in $(ctr -a "$containerd_sock" -n k8s.io tasks ls -q 2>/dev/null); do
				ctr -a "$containerd_sock" -n k8s.io tasks delete -f "$id" >/dev/null 2>&1 || true
			done
			sleep 0.1
		done
	fi
	stop_pid containerd
	local pid
	for pid in $(node_shims); do kill -KILL "$pid" 2>/dev/null || true; done
	stop_pid kube-apiserver
	stop_pid etcd
	# Any other process still running from the node's binaries or state (a container process
	# whose shim was killed is reparented, not ended).
	for _ in $(seq 50); do [ -z "$(node_shims)" ] && break; sleep 0.1; done
	cleanup_host
	# Keep the last node's logs for a look after a failure (LAST_LOGS, outside the state).
	if [ -d "$logs" ]; then
		rm -rf "$LAST_LOGS"
		cp -r "$logs" "$LAST_LOGS" 2>/dev/null || true
	fi
	rm -rf "$NODE_DIR"
	log "node stopped (its logs: $LAST_LOGS)"
}

# cleanup_host undoes the node's changes outside NODE_DIR; each step is a no-op when already done.
cleanup_host() {
	# kube-proxy's own cleanup first (it knows its iptables, ipvs and nftables rules), then the rest.
	if [ -x "${NODE_BIN:-}/kube-proxy" ]; then
		"$NODE_BIN/kube-proxy" --cleanup >/dev/null 2>&1 || true
	fi
	iptables_clean iptables
	iptables_clean ip6tables
	# Mounts below the state directory (pod volumes, sandbox shm, network namespaces, rootfs), deepest first.
	local m
	if [ -d "$NODE_DIR" ]; then
		for m in $(findmnt -rn -o TARGET | grep -F "$NODE_DIR" | sort -r); do
			umount "$m" 2>/dev/null || umount -l "$m" 2>/dev/null || true
		done
	fi
	# The pods' cgroups in every hierarchy, deepest first.
	local hier
	for hier in /sys/fs/cgroup/*/ /sys/fs/cgroup/; do
		if [ -d "$hier${CGROUP_ROOT#/}" ]; then
			find "$hier${CGROUP_ROOT#/}" -depth -type d -exec rmdir {} \; 2>/dev/null || true
		fi
	done
	# The bridge and its routes, and veth ends left by killed sandboxes.
	ip link del "$BRIDGE" 2>/dev/null || true
	# The sysctls, as they were before up.
	if [ -f "$NODE_DIR/sysctls.saved" ]; then
		local k v
		while read -r k v; do
			sysctl -qw "$k=$v" >/dev/null 2>&1 || log "cannot restore $k=$v"
		done <"$NODE_DIR/sysctls.saved"
		rm -f "$NODE_DIR/sysctls.saved"
	fi
}

# ------------------------------------------------------------------------------------------------ up

need() { [ -x "$1" ] || die "$1 is missing: $2"; }

pki_gen() {
	mkdir -p "$pki"
	local days=30
	openssl req -x509 -newkey rsa:2048 -nodes -days "$days" -subj "/CN=limiterd-node-ca" \
		-keyout "$pki/ca.key" -out "$pki/ca.crt" 2>/dev/null
	openssl genrsa -out "$pki/sa.key" 2048 2>/dev/null
	openssl rsa -in "$pki/sa.key" -pubout -out "$pki/sa.pub" 2>/dev/null
	# cert <name> <subject> [subjectAltName]
	cert() {
		openssl req -newkey rsa:2048 -nodes -subj "$2" -keyout "$pki/$1.key" -out "$pki/$1.csr" 2>/dev/null
		local ext=$pki/$1.ext
		printf 'basicConstraints=CA:FALSE\nkeyUsage=digitalSignature,keyEncipherment\nextendedKeyUsage=serverAuth,clientAuth\n' >"$ext"
		[ -n "${3:-}" ] && printf 'subjectAltName=%s\n' "$3" >>"$ext"
		openssl x509 -req -in "$pki/$1.csr" -CA "$pki/ca.crt" -CAkey "$pki/ca.key" -CAcreateserial \
			-days "$days" -extfile "$ext" -out "$pki/$1.crt" 2>/dev/null
		rm -f "$pki/$1.csr" "$ext"
	}
	local svc_ip=${SERVICE_CIDR%.*}.1
	cert apiserver "/CN=kube-apiserver" "IP:$NODE_IP,IP:$svc_ip,IP:127.0.0.1,DNS:kubernetes,DNS:kubernetes.default,DNS:kubernetes.default.svc,DNS:kubernetes.default.svc.cluster.local"
	cert apiserver-kubelet-client "/O=system:masters/CN=kube-apiserver-kubelet-client"
	cert admin "/O=system:masters/CN=limiterd-node-admin"
	cert kube-controller-manager "/CN=system:kube-controller-manager"
	cert kube-scheduler "/CN=system:kube-scheduler"
	cert kubelet "/O=system:nodes/CN=system:node:$NODE_NAME" "IP:$NODE_IP,DNS:$NODE_NAME"
	cert kube-proxy "/CN=system:kube-proxy"
	local who
	for who in admin kube-controller-manager kube-scheduler kubelet kube-proxy; do
		cat >"$NODE_DIR/$who.kubeconfig" <<EOF
apiVersion: v1
kind: Config
clusters:
  - name: limiterd-node
    cluster:
      server: https://$NODE_IP:$API_PORT
      certificate-authority: $pki/ca.crt
users:
  - name: $who
    user:
      client-certificate: $pki/$who.crt
      client-key: $pki/$who.key
contexts:
  - name: limiterd-node
    context: {cluster: limiterd-node, user: $who}
current-context: limiterd-node
EOF
	done
}

# start <name> <command>...: run in the background, in its own session, logging to logs/<name>.log.
start() {
	local name=$1
	shift
	setsid "$@" >"$logs/$name.log" 2>&1 </dev/null &
	echo $! >"$run/$name.pid"
}

# wait_for <what> <seconds> <command>...: retry the command every 0.2 s.
wait_for() {
	local what=$1 secs=$2 deadline
	shift 2
	deadline=$((SECONDS + secs))
	until "$@" >/dev/null 2>&1; do
		[ $SECONDS -lt $deadline ] || die "timed out after ${secs}s waiting for $what (logs: $logs)"
		sleep 0.2
	done
}

# api <path>: GET from the API server as the node's admin.
api() { curl -sf --max-time 5 --cacert "$pki/ca.crt" --cert "$pki/admin.crt" --key "$pki/admin.key" "https://$NODE_IP:$API_PORT$1"; }
node_ready() { api "/api/v1/nodes/$NODE_NAME" | jq -e '.status.conditions[] | select(.type == "Ready") | .status == "True"' | grep -qx true; }

save_sysctls() {
	local k v
	: >"$NODE_DIR/sysctls.saved"
	for k in "${SYSCTLS[@]}"; do
		v=$(sysctl -n "$k" 2>/dev/null) || continue
		printf '%s %s\n' "$k" "$v" >>"$NODE_DIR/sysctls.saved"
	done
}

network_up() {
	ip link add "$BRIDGE" type bridge
	ip addr add "$NODE_IP/${POD_CIDR#*/}" dev "$BRIDGE"
	ip link set "$BRIDGE" up
	# Service addresses that kube-proxy has not (yet) translated stay on the bridge.
	ip route add "$SERVICE_CIDR" dev "$BRIDGE" src "$NODE_IP"
	# Forwarding (pod -> ClusterIP -> pod) is needed, but only from the bridge to the bridge: a chain
	# in mangle, which runs before kube-proxy's filter rules and that they cannot override.
	local forward_was
	forward_was=$(sysctl -n net.ipv4.ip_forward)
	iptables -t mangle -N "$FWD_CHAIN"
	iptables -t mangle -A "$FWD_CHAIN" -i "$BRIDGE" -o "$BRIDGE" -j RETURN
	if [ "$forward_was" = 0 ]; then
		iptables -t mangle -A "$FWD_CHAIN" -j DROP # nothing else was forwarded before
	else
		iptables -t mangle -A "$FWD_CHAIN" -i "$BRIDGE" -j DROP
		iptables -t mangle -A "$FWD_CHAIN" -o "$BRIDGE" -j DROP
	fi
	iptables -t mangle -I FORWARD 1 -j "$FWD_CHAIN"
	sysctl -qw net.ipv4.ip_forward=1
	sysctl -qw net.bridge.bridge-nf-call-iptables=1
	mkdir -p "$NODE_DIR/cni/net.d" "$NODE_DIR/cni/ipam"
	# No default route and no masquerading: a pod reaches the node, the pods and the Services only.
	cat >"$NODE_DIR/cni/net.d/10-limiterd-node.conflist" <<EOF
{
  "cniVersion": "0.4.0",
  "name": "limiterd-node",
  "plugins": [
    {
      "type": "bridge",
      "bridge": "$BRIDGE",
      "isGateway": true,
      "ipMasq": false,
      "hairpinMode": true,
      "ipam": {
        "type": "host-local",
        "dataDir": "$NODE_DIR/cni/ipam",
        "ranges": [[{"subnet": "$POD_CIDR", "gateway": "$NODE_IP"}]],
        "routes": [{"dst": "$SERVICE_CIDR"}]
      }
    }
  ]
}
EOF
}

containerd_up() {
	mkdir -p "$NODE_DIR/containerd"
	cat >"$NODE_DIR/containerd/config.toml" <<EOF
version = 2
root = "$NODE_DIR/containerd/root"
state = "$NODE_DIR/containerd/state"
disabled_plugins = ["io.containerd.snapshotter.v1.aufs", "io.containerd.snapshotter.v1.btrfs", "io.containerd.snapshotter.v1.devmapper", "io.containerd.snapshotter.v1.zfs", "io.containerd.tracing.processor.v1.otlp"]
[grpc]
  address = "$containerd_sock"
[ttrpc]
  address = "$containerd_sock.ttrpc"
[debug]
  address = ""
[plugins."io.containerd.internal.v1.opt"]
  path = "$NODE_DIR/containerd/opt"
[plugins."io.containerd.grpc.v1.cri"]
  sandbox_image = "$PAUSE_IMAGE"
  # This VM refuses a negative oom_score_adj (runc: "can't get final child's PID from pipe: EOF").
  restrict_oom_score_adj = true
  netns_mounts_under_state_dir = true
  disable_apparmor = true
  [plugins."io.containerd.grpc.v1.cri".containerd]
    snapshotter = "overlayfs"
    default_runtime_name = "runc"
    [plugins."io.containerd.grpc.v1.cri".containerd.runtimes.runc]
      runtime_type = "io.containerd.runc.v2"
      [plugins."io.containerd.grpc.v1.cri".containerd.runtimes.runc.options]
        SystemdCgroup = false
        Root = "$NODE_DIR/runc"
  [plugins."io.containerd.grpc.v1.cri".cni]
    bin_dir = "$CNI_BIN"
    conf_dir = "$NODE_DIR/cni/net.d"
EOF
	start containerd containerd --config "$NODE_DIR/containerd/config.toml"
}

import_images() {
	local archive
	for archive in "$NODE_DIR/pause.tar" $NODE_IMAGES; do
		ctr -a "$containerd_sock" -n k8s.io images import --no-unpack=false "$archive" >/dev/null ||
			die "ctr images import $archive failed"
	done
}

# cgroups_up creates the kubelet's cgroup root in every hierarchy (the kubelet requires it to
# exist); a cgroup v1 cpuset needs its CPUs and memory nodes before it can hold a process.
cgroups_up() {
	local hier
	for hier in /sys/fs/cgroup/*/; do
		mkdir -p "$hier${CGROUP_ROOT#/}"
	done
	if [ -f /sys/fs/cgroup/cpuset/cpuset.cpus ]; then
		cat /sys/fs/cgroup/cpuset/cpuset.cpus >"/sys/fs/cgroup/cpuset${CGROUP_ROOT}/cpuset.cpus"
		cat /sys/fs/cgroup/cpuset/cpuset.mems >"/sys/fs/cgroup/cpuset${CGROUP_ROOT}/cpuset.mems"
	fi
}

kubelet_up() {
	mkdir -p "$NODE_DIR/kubelet" "$NODE_DIR/pod-logs"
	cgroups_up
	cat >"$NODE_DIR/kubelet.yaml" <<EOF
apiVersion: kubelet.config.k8s.io/v1beta1
kind: KubeletConfiguration
# This machine has cgroup v1; the kubelet refuses it unless told.
failCgroupV1: false
# This VM refuses a negative oom_score_adj.
oomScoreAdj: 0
cgroupDriver: cgroupfs
cgroupRoot: $CGROUP_ROOT
containerRuntimeEndpoint: unix://$containerd_sock
address: $NODE_IP
port: 10250
readOnlyPort: 0
healthzBindAddress: 127.0.0.1
healthzPort: 10248
tlsCertFile: $pki/kubelet.crt
tlsPrivateKeyFile: $pki/kubelet.key
rotateCertificates: false
authentication:
  anonymous: {enabled: false}
  webhook: {enabled: true}
  x509: {clientCAFile: $pki/ca.crt}
authorization: {mode: Webhook}
# No cluster DNS runs here: pods get no nameserver (never the host's resolver).
resolvConf: ""
clusterDomain: cluster.local
podLogsDir: $NODE_DIR/pod-logs
failSwapOn: false
# A test node on a shared disk: evict only when it is really full, never collect the imported images.
evictionHard: {memory.available: "100Mi", nodefs.available: "1%", imagefs.available: "1%", nodefs.inodesFree: "1%"}
imageGCHighThresholdPercent: 100
imageGCLowThresholdPercent: 99
serializeImagePulls: false
EOF
	start kubelet "$NODE_BIN/kubelet" --config "$NODE_DIR/kubelet.yaml" --kubeconfig "$NODE_DIR/kubelet.kubeconfig" \
		--hostname-override "$NODE_NAME" --node-ip "$NODE_IP" --root-dir "$NODE_DIR/kubelet" --cert-dir "$pki" --v=1
}

kube_proxy_up() {
	cat >"$NODE_DIR/kube-proxy.yaml" <<EOF
apiVersion: kubeproxy.config.k8s.io/v1alpha1
kind: KubeProxyConfiguration
clientConnection: {kubeconfig: $NODE_DIR/kube-proxy.kubeconfig}
mode: iptables
hostnameOverride: $NODE_NAME
clusterCIDR: $POD_CIDR
# This VM refuses a negative oom_score_adj.
oomScoreAdj: 0
bindAddress: $NODE_IP
healthzBindAddress: 127.0.0.1:10256
metricsBindAddress: 127.0.0.1:10249
nodePortAddresses: ["$NODE_IP/32"]
iptables: {localhostNodePorts: false}
# Leave the host's conntrack settings alone.
conntrack: {maxPerCore: 0, min: 0, tcpEstablishedTimeout: 0s, tcpCloseWaitTimeout: 0s}
EOF
	start kube-proxy "$NODE_BIN/kube-proxy" --config "$NODE_DIR/kube-proxy.yaml" --v=1
}

control_plane_up() {
	start etcd "$ENVTEST_BIN/etcd" --name "$NODE_NAME" --data-dir "$NODE_DIR/etcd" \
		--listen-client-urls "http://127.0.0.1:$ETCD_PORT" --advertise-client-urls "http://127.0.0.1:$ETCD_PORT" \
		--listen-peer-urls "http://127.0.0.1:$((ETCD_PORT + 1))" --initial-advertise-peer-urls "http://127.0.0.1:$((ETCD_PORT + 1))" \
		--initial-cluster "$NODE_NAME=http://127.0.0.1:$((ETCD_PORT + 1))" --unsafe-no-fsync
	start kube-apiserver "$ENVTEST_BIN/kube-apiserver" \
		--etcd-servers "http://127.0.0.1:$ETCD_PORT" \
		--bind-address "$NODE_IP" --advertise-address "$NODE_IP" --secure-port "$API_PORT" \
		--service-cluster-ip-range "$SERVICE_CIDR" \
		--client-ca-file "$pki/ca.crt" --tls-cert-file "$pki/apiserver.crt" --tls-private-key-file "$pki/apiserver.key" \
		--service-account-issuer https://kubernetes.default.svc.cluster.local \
		--service-account-key-file "$pki/sa.pub" --service-account-signing-key-file "$pki/sa.key" \
		--kubelet-client-certificate "$pki/apiserver-kubelet-client.crt" --kubelet-client-key "$pki/apiserver-kubelet-client.key" \
		--kubelet-preferred-address-types InternalIP \
		--authorization-mode Node,RBAC --enable-admission-plugins NodeRestriction \
		--allow-privileged=false --profiling=false
	wait_for "kube-apiserver /readyz" 60 api /readyz
	local c
	for c in kube-controller-manager kube-scheduler; do
		local extra=()
		[ "$c" = kube-controller-manager ] && extra=(--service-account-private-key-file "$pki/sa.key"
			--root-ca-file "$pki/ca.crt" --use-service-account-credentials)
		start "$c" "$NODE_BIN/$c" --kubeconfig "$NODE_DIR/$c.kubeconfig" \
			--authentication-kubeconfig "$NODE_DIR/$c.kubeconfig" --authorization-kubeconfig "$NODE_DIR/$c.kubeconfig" \
			--bind-address 127.0.0.1 --leader-elect=false "${extra[@]}"
	done
}

up() {
	[ "$(id -u)" = 0 ] || die "must run as root (it starts containerd and the kubelet)"
	for b in kubelet kube-controller-manager kube-scheduler kube-proxy; do need "${NODE_BIN:?NODE_BIN is not set}/$b" "make node-binaries"; done
	for b in kube-apiserver etcd; do need "${ENVTEST_BIN:?ENVTEST_BIN is not set}/$b" "make envtest"; done
	[ -f "${PAUSE_IMAGE_ARCHIVE:?PAUSE_IMAGE_ARCHIVE is not set}" ] || die "$PAUSE_IMAGE_ARCHIVE is missing: make node-images"
	for b in ${NODE_IMAGES:-}; do [ -f "$b" ] || die "$b is missing: make images"; done
	for b in containerd containerd-shim-runc-v2 runc ctr iptables conntrack ip openssl curl jq setsid findmnt; do
		command -v "$b" >/dev/null || die "$b is missing (apt-get install containerd runc containernetworking-plugins iptables conntrack openssl curl jq)"
	done
	for b in bridge host-local loopback; do need "$CNI_BIN/$b" "apt-get install containernetworking-plugins"; done
	local t0=$SECONDS
	down
	mkdir -p "$run" "$logs"
	cp "$PAUSE_IMAGE_ARCHIVE" "$NODE_DIR/pause.tar"
	save_sysctls
	# From here on a failure leaves a half-started node: stop it.
	up_ok=0
	trap 'if [ "$up_ok" != 1 ]; then log "up failed; cleaning up"; down; fi' EXIT
	network_up
	pki_gen
	control_plane_up
	containerd_up
	wait_for "containerd" 30 ctr -a "$containerd_sock" version
	import_images
	kubelet_up
	kube_proxy_up
	wait_for "node $NODE_NAME Ready" 90 node_ready
	wait_for "the default ServiceAccount" 30 api /api/v1/namespaces/default/serviceaccounts/default
	up_ok=1
	log "node $NODE_NAME Ready in $((SECONDS - t0))s (kubeconfig $kubeconfig)"
	echo "$kubeconfig"
}

env_() {
	cat <<EOF
NODE_DIR=$NODE_DIR
KUBECONFIG=$kubeconfig
NODE_NAME=$NODE_NAME
NODE_IP=$NODE_IP
POD_CIDR=$POD_CIDR
SERVICE_CIDR=$SERVICE_CIDR
PAUSE_IMAGE=$PAUSE_IMAGE
CONTAINERD_ADDRESS=$containerd_sock
EOF
}

case "${1:-}" in
up) up ;;
down) down ;;
env) env_ ;;
*) die "usage: $0 up|down|env (see the comment at the top)" ;;
esac
