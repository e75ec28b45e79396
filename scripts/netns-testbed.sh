#!/usr/bin/env bash
# A small cluster on one machine: network namespaces that pose as hosts (docs/multinode.md).
#
#   scripts/netns-testbed.sh up NAME N          N nodes NAME-0 .. NAME-(N-1), 1 <= N <= 16
#   scripts/netns-testbed.sh down NAME          removes the bed (idempotent; after a crash too)
#   scripts/netns-testbed.sh exec NAME K CMD... runs CMD in node K (ip netns exec)
#   scripts/netns-testbed.sh addr NAME K        prints node K's address
#   scripts/netns-testbed.sh nodes NAME         prints how many nodes the bed has (0: none)
#   scripts/netns-testbed.sh kill NAME          SIGKILLs every process left in the bed's nodes
#   scripts/netns-testbed.sh check              exits 0 when beds can be made here, else 77
#
# Each node is a network namespace with its loopback up and one veth, eth0, whose other end
# is a port of a bridge inside a "switch" namespace NAME-sw: the nodes share one L2 segment
# and reach each other at 10.X.0.(K+1)/24, and share nothing else (each its own loopback).
# The root namespace's interfaces, routes and firewall are never touched. X is derived from
# NAME (and moved on when another namespace of this machine already uses 10.X.0.0/24), so
# beds of different names have different subnets. Without the bridge driver (or with
# GRADWIRE_NETNS_TOPOLOGY=mesh) every pair of nodes gets a veth pair of its own instead,
# with the node's address on each of its ends and a host route to the peer.
#
# `up` first removes any earlier bed of that name, then checks what it built: every node
# reaches every other one over TCP, and a listener on 127.0.0.1 in node 0 is reachable
# there but not from node 1 (no shared loopback). The checks use perl (part of every
# Debian system) for the listener and bash's /dev/tcp for the connections.
#
# Exit status: 0 on success; 77 when namespaces cannot be made here (no `ip`, no
# CAP_NET_ADMIN / CAP_SYS_ADMIN, or namespaces refused by a container), with the reason on
# stderr; 2 for a bad command line; 1 when the bed was made but fails its checks (it is
# then removed again).
set -uo pipefail

readonly kSkip=77
readonly kBridge=br0
topology=${GRADWIRE_NETNS_TOPOLOGY:-bridge}

die() {
  echo "netns-testbed: $*" >&2
  exit 1
}
usage() {
  echo "netns-testbed: $*" >&2
  sed -n '4,10p' "$0" | sed 's/^# \{0,1\}//' >&2
  exit 2
}
skip() {
  echo "netns-testbed: cannot make network namespaces here: $*" >&2
  exit "$kSkip"
}

valid_name() {
  # Namespace names become file names under /run/netns: keep them plain.
  [[ $1 =~ ^[A-Za-z0-9][A-Za-z0-9_.]{0,31}$ ]] || usage "NAME '$1' must be 1-32 letters, digits, '_' or '.' (no '-': it separates the node number)"
}

# Capabilities and tools, without changing anything.
preflight() {
  command -v ip >/dev/null 2>&1 || skip "the 'ip' command (iproute2) is not installed"
  command -v perl >/dev/null 2>&1 || skip "perl is not installed (the self-check's listener needs it)"
  local eff
  eff=$(awk '/^CapEff:/ {print $2}' /proc/self/status 2>/dev/null)
  # CAP_NET_ADMIN is bit 12; CAP_SYS_ADMIN (ip netns mounts the namespace's file) bit 21.
  if [[ -n $eff ]] && ((((0x$eff >> 12) & 1) == 0 || ((0x$eff >> 21) & 1) == 0)); then
    skip "this process lacks CAP_NET_ADMIN or CAP_SYS_ADMIN (run as root, or in a privileged container)"
  fi
}

# Namespaces of the bed NAME: its nodes in order, then its switch (when present).
bed_nodes() {
  local name=$1
  ip netns list 2>/dev/null | awk '{print $1}' | grep -E "^${name//./\\.}-[0-9]+$" |
    sed "s/^.*-//" | sort -n
}
node_count() {
  local nodes
  nodes=$(bed_nodes "$1")
  grep -c . <<<"$nodes"
  return 0
}

node_ns() { echo "$1-$2"; }
switch_ns() { echo "$1-sw"; }

# Every 10.X.0.0/24 subnet some namespace of this machine (or the root one) uses.
used_subnets() {
  {
    ip -4 -o addr show 2>/dev/null
    local ns
    for ns in $(ip netns list 2>/dev/null | awk '{print $1}'); do
      ip -n "$ns" -4 -o addr show 2>/dev/null
    done
  } | grep -oE 'inet 10\.[0-9]+\.0\.' | awk -F. '{print $2}' | sort -un
}

# The second octet for NAME: a hash of the name in [20, 219], moved on past used ones.
pick_subnet() {
  local name=$1 x used tries
  x=$(($(printf '%s' "$name" | cksum | awk '{print $1}') % 200 + 20))
  used=" $(used_subnets | tr '\n' ' ') "
  for ((tries = 0; tries < 200; tries++)); do
    [[ $used == *" $x "* ]] || {
      echo "$x"
      return 0
    }
    x=$(((x - 20 + 1) % 200 + 20))
  done
  die "every subnet 10.20-219.0.0/24 is in use"
}

node_addr() {
  local name=$1 k=$2 addr
  addr=$(ip -n "$(node_ns "$name" "$k")" -4 -o addr show scope global 2>/dev/null |
    awk '{print $4}' | head -n 1)
  [[ -n $addr ]] || return 1
  echo "${addr%/*}"
}

kill_bed_processes() {
  local name=$1 ns pids
  for ns in $(ip netns list 2>/dev/null | awk '{print $1}' | grep -E "^${name//./\\.}-([0-9]+|sw)$"); do
    pids=$(ip netns pids "$ns" 2>/dev/null | tr '\n' ' ')
    # shellcheck disable=SC2086
    [[ -n ${pids// /} ]] && kill -KILL $pids 2>/dev/null
  done
  return 0
}

cmd_down() {
  local name=$1 ns
  kill_bed_processes "$name"
  for ns in $(ip netns list 2>/dev/null | awk '{print $1}' | grep -E "^${name//./\\.}-([0-9]+|sw)$"); do
    ip netns del "$ns" 2>/dev/null || ip netns del "$ns" 2>/dev/null ||
      echo "netns-testbed: could not remove namespace $ns" >&2
  done
  return 0
}

# TCP connect from node K to ADDR:PORT; status 0 when it connects within 2 s.
can_connect() {
  local name=$1 k=$2 addr=$3 port=$4
  ip netns exec "$(node_ns "$name" "$k")" timeout 2 bash -c "exec 3<>/dev/tcp/$addr/$port" \
    2>/dev/null
}

# Waits (at most 5 s) until node K can connect to ADDR:PORT.
wait_connect() {
  local deadline=$((SECONDS + 5))
  until can_connect "$@"; do
    ((SECONDS < deadline)) || return 1
  done
}

# A TCP listener in node K on ADDR:PORT, accepting (and closing) connections for at most
# 30 s; prints its pid.
start_listener() {
  local name=$1 k=$2 addr=$3 port=$4
  ip netns exec "$(node_ns "$name" "$k")" perl -MIO::Socket::INET -e '
    alarm 30;
    my $s = IO::Socket::INET->new(LocalAddr => $ARGV[0], LocalPort => $ARGV[1], Listen => 16,
                                  ReuseAddr => 1, Proto => "tcp") or die "listen: $!\n";
    while (my $c = $s->accept) { close $c }' "$addr" "$port" >/dev/null 2>&1 &
  echo $!
}

self_check() {
  local name=$1 n=$2 port=7 k j pids=() failed=""
  # Port 7 (echo): nothing else listens there in a fresh namespace.
  for ((k = 0; k < n; k++)); do
    pids+=("$(start_listener "$name" "$k" 0.0.0.0 "$port")")
  done
  for ((k = 0; k < n; k++)); do
    wait_connect "$name" "$k" 127.0.0.1 "$port" ||
      failed+=" node $k's listener did not start;"
  done
  if [[ -z $failed ]]; then
    for ((k = 0; k < n; k++)); do
      for ((j = 0; j < n; j++)); do
        ((j == k)) && continue
        can_connect "$name" "$k" "10.$subnet.0.$((j + 1))" "$port" ||
          failed+=" node $k cannot reach node $j at 10.$subnet.0.$((j + 1)):$port;"
      done
    done
  fi
  kill "${pids[@]}" 2>/dev/null
  wait "${pids[@]}" 2>/dev/null
  if [[ -z $failed && $n -ge 2 ]]; then
    local lo
    lo=$(start_listener "$name" 0 127.0.0.1 "$port")
    if ! wait_connect "$name" 0 127.0.0.1 "$port"; then
      failed+=" node 0's loopback listener did not start;"
    elif can_connect "$name" 1 127.0.0.1 "$port"; then
      failed+=" node 1 reached a listener on node 0's 127.0.0.1 (shared loopback);"
    fi
    kill "$lo" 2>/dev/null
    wait "$lo" 2>/dev/null
  fi
  [[ -z $failed ]] || {
    echo "netns-testbed: self-check failed:$failed" >&2
    return 1
  }
}

ns_add() {
  local out
  out=$(ip netns add "$1" 2>&1) && return 0
  case $out in
  *"Operation not permitted"* | *"Permission denied"* | *"Read-only file system"*)
    cmd_down "$bed_name"
    skip "'ip netns add $1' failed: $out"
    ;;
  esac
  cmd_down "$bed_name"
  die "'ip netns add $1' failed: $out"
}

run() {
  local out
  out=$("$@" 2>&1) && return 0
  cmd_down "$bed_name"
  case $out in
  *"Operation not permitted"* | *"Permission denied"*) skip "'$*' failed: $out" ;;
  esac
  die "'$*' failed: $out"
}

cmd_up() {
  local name=$1 n=$2 k j ns sw
  bed_name=$name
  cmd_down "$name"
  subnet=$(pick_subnet "$name")
  sw=$(switch_ns "$name")
  for ((k = 0; k < n; k++)); do
    ns=$(node_ns "$name" "$k")
    ns_add "$ns"
    run ip -n "$ns" link set lo up
  done
  if [[ $topology == bridge ]]; then
    ns_add "$sw"
    run ip -n "$sw" link set lo up
    if ip -n "$sw" link add "$kBridge" type bridge 2>/dev/null; then
      run ip -n "$sw" link set "$kBridge" up
      for ((k = 0; k < n; k++)); do
        ns=$(node_ns "$name" "$k")
        run ip link add eth0 netns "$ns" type veth peer name "p$k" netns "$sw"
        run ip -n "$sw" link set "p$k" master "$kBridge"
        run ip -n "$sw" link set "p$k" up
        run ip -n "$ns" addr add "10.$subnet.0.$((k + 1))/24" dev eth0
        run ip -n "$ns" link set eth0 up
      done
    else
      echo "netns-testbed: no bridge driver here; joining the nodes pairwise instead" >&2
      ip netns del "$sw" 2>/dev/null
      topology=mesh
    fi
  fi
  if [[ $topology == mesh ]]; then
    for ((k = 0; k < n; k++)); do
      for ((j = k + 1; j < n; j++)); do
        run ip link add "v$k-$j" netns "$(node_ns "$name" "$k")" type veth \
          peer name "v$j-$k" netns "$(node_ns "$name" "$j")"
      done
    done
    for ((k = 0; k < n; k++)); do
      ns=$(node_ns "$name" "$k")
      for ((j = 0; j < n; j++)); do
        ((j == k)) && continue
        run ip -n "$ns" addr add "10.$subnet.0.$((k + 1))/32" dev "v$k-$j"
        run ip -n "$ns" link set "v$k-$j" up
        run ip -n "$ns" route add "10.$subnet.0.$((j + 1))/32" dev "v$k-$j" \
          src "10.$subnet.0.$((k + 1))"
      done
    done
  elif [[ $topology != bridge ]]; then
    cmd_down "$name"
    usage "GRADWIRE_NETNS_TOPOLOGY='$topology' must be bridge or mesh"
  fi
  if ! self_check "$name" "$n"; then
    cmd_down "$name"
    exit 1
  fi
  for ((k = 0; k < n; k++)); do
    echo "$(node_ns "$name" "$k") 10.$subnet.0.$((k + 1))"
  done
}

cmd=${1:-}
case $cmd in
up)
  [[ $# -eq 3 ]] || usage "up takes NAME N"
  valid_name "$2"
  if ! [[ $3 =~ ^[0-9]+$ ]] || (($3 < 1 || $3 > 16)); then
    usage "N='$3' must be a number in [1, 16]"
  fi
  preflight
  cmd_up "$2" "$3"
  ;;
down)
  [[ $# -eq 2 ]] || usage "down takes NAME"
  valid_name "$2"
  command -v ip >/dev/null 2>&1 || exit 0
  cmd_down "$2"
  ;;
exec)
  [[ $# -ge 4 ]] || usage "exec takes NAME K CMD..."
  valid_name "$2"
  [[ $3 =~ ^[0-9]+$ ]] || usage "K='$3' must be a node number"
  ns=$(node_ns "$2" "$3")
  ip netns list 2>/dev/null | awk '{print $1}' | grep -qxF "$ns" ||
    die "no node $3 in bed '$2' (is it up? scripts/netns-testbed.sh up $2 N)"
  shift 3
  exec ip netns exec "$ns" "$@"
  ;;
addr)
  [[ $# -eq 3 ]] || usage "addr takes NAME K"
  valid_name "$2"
  node_addr "$2" "$3" || die "no node $3 in bed '$2' (is it up?)"
  ;;
nodes)
  [[ $# -eq 2 ]] || usage "nodes takes NAME"
  valid_name "$2"
  node_count "$2"
  ;;
kill)
  [[ $# -eq 2 ]] || usage "kill takes NAME"
  valid_name "$2"
  kill_bed_processes "$2"
  ;;
check)
  [[ $# -eq 1 ]] || usage "check takes nothing"
  preflight
  probe="gwprobe$$"
  bed_name=$probe
  ns_add "$probe-0"
  cmd_down "$probe"
  ;;
*) usage "unknown command '${cmd}'" ;;
esac
