#!/usr/bin/env bash
# The multinode fixture: `bed.sh up N` brings up the bed of N nodes the cases share, `bed.sh
# down` removes it (scripts/netns-testbed.sh). Where namespaces cannot be made, `up` records
# the reason (the cases print it when they skip) and exits 77, which CTest reports as skipped.
set -uo pipefail
: "${TESTBED:?}" "${BED:?}" "${BED_STATE:?}"
mkdir -p "$BED_STATE"
case ${1:-} in
up)
  rm -f "$BED_STATE/skip-reason"
  out=$("$TESTBED" up "$BED" "${2:?usage: bed.sh up N}" 2>&1)
  status=$?
  echo "$out"
  if ((status == 77)); then
    echo "$out" | grep -m1 'cannot make network namespaces' >"$BED_STATE/skip-reason"
  fi
  exit "$status"
  ;;
down)
  "$TESTBED" down "$BED"
  # Nothing of the bed may outlive it.
  if ((${#BED} > 0)) && ip netns list 2>/dev/null | awk '{print $1}' | grep -q "^$BED-"; then
    echo "bed.sh: namespaces of $BED are left:" >&2
    ip netns list >&2
    exit 1
  fi
  echo "bed $BED removed"
  ;;
*)
  echo "usage: bed.sh up N | down" >&2
  exit 2
  ;;
esac
