#!/usr/bin/env bash
# Installs the Debian/Ubuntu packages NetApprox needs (as root), skipping apt entirely when all are present.
# prometheus: the server the dashboard test scrapes the controller with (tests/tools/test_prometheus.py); its
# package would start a system service on install, which this script prevents (it starts nothing).
# openjdk-17-jre-headless: the JVM pyspark runs on (analytics/spark.py, tests/analytics/test_spark.py).
# redis-server: the broker of the streaming broker stage (analytics/broker.py); its test runs its own on a loopback
# port, and no service starts on install (below).
set -euo pipefail
pkgs=(python3-venv python3-dev gcc iproute2 iputils-ping ethtool bridge-utils iperf3 mininet clang libbpf-dev tcpdump tshark prometheus openjdk-17-jre-headless redis-server)
missing=()
for p in "${pkgs[@]}"; do
    dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
if [ ${#missing[@]} -eq 0 ]; then
    exit 0
fi
if [ "$(id -u)" -ne 0 ]; then
    echo "setup-system: missing packages ${missing[*]}; run as root (or: sudo apt-get install ${missing[*]})" >&2
    exit 1
fi
echo "setup-system: installing ${missing[*]}"
export DEBIAN_FRONTEND=noninteractive
# tshark's postinst asks whether non-root users may capture; answer "no" (no setuid dumpcap) without a prompt.
echo "wireshark-common wireshark-common/install-setuid boolean false" | debconf-set-selections
# No service starts on install (prometheus would otherwise run as a daemon until the machine stops): a
# policy-rc.d that denies every start, only while apt runs and only if the machine has none of its own.
guard=/usr/sbin/policy-rc.d
own_guard=0
if [ ! -e "$guard" ]; then
    printf '#!/bin/sh\nexit 101\n' > "$guard" && chmod 755 "$guard" && own_guard=1
    trap '[ $own_guard -eq 1 ] && rm -f "$guard"' EXIT
fi
apt-get update -qq
apt-get install -y -qq --no-install-recommends "${missing[@]}"
