#!/usr/bin/env bash
# On the GPU machine (root): what a worker's attach (map + pin) of a shared pool costs on each
# kind of page a host can give the pool, one pool at a time (bench/gpu-probe/attach_probe.c):
#   shm4k        /dev/shm (tmpfs, 4 KiB pages: the default pool path)
#   shm4k_pop    the same, the worker's page tables populated at map (MAP_POPULATE)
#   thp          a tmpfs mounted with huge=always (transparent 2 MiB pages)
#   thp_pop      the same with MAP_POPULATE
#   thp_two      two workers (two GPUs where there are two) attaching at once
#   hugetlb      hugetlbfs (2 MiB pages reserved through vm.nr_hugepages, put back after)
# Writes $1/attach-probe.json (one object per case) and $1/attach-probe.log.
set -uo pipefail
out=${1:-out}
bytes=${BYTES:-64424509440}
mkdir -p "$out"
log="$out/attach-probe.log"
nvcc -O2 -o /tmp/attach_probe bench/gpu-probe/attach_probe.c -L/usr/local/cuda/lib64/stubs -lcuda -lpthread > "$log" 2>&1 \
  || { cat "$log"; exit 1; }
devices=$(nvidia-smi -L | wc -l)
json="{"
sep=""
record() { # name, create json, attach json(s)
  json+="$sep\"$1\": {\"create\": $2, \"attach\": [$3]}"
  sep=", "
  echo "$1: create $2 attach $3" | tee -a "$log"
}
case_on() { # name dir populate workers
  local f="$2/pegaflow-probe.pool"
  local c a
  c=$(/tmp/attach_probe create "$f" "$bytes" 16) || { echo "$1: create failed" | tee -a "$log"; return; }
  if [ "$4" = 2 ]; then
    /tmp/attach_probe attach "$f" "$bytes" 0 $3 > /tmp/probe-a0 &
    /tmp/attach_probe attach "$f" "$bytes" $(( 1 % devices )) $3 > /tmp/probe-a1 &
    wait
    a="$(cat /tmp/probe-a0), $(cat /tmp/probe-a1)"
  else
    a=$(/tmp/attach_probe attach "$f" "$bytes" 0 $3)
  fi
  record "$1" "$c" "${a:-null}"
  rm -f "$f"
}
{
  echo "host: $(nproc) cpus, $(free -g | awk '/Mem:/ {print $2}') GiB; kernel $(uname -r)"
  echo "thp enabled: $(cat /sys/kernel/mm/transparent_hugepage/enabled); shmem_enabled: $(cat /sys/kernel/mm/transparent_hugepage/shmem_enabled)"
  grep -i huge /proc/meminfo
} 2>&1 | tee -a "$log"
case_on shm4k /dev/shm "" 1
case_on shm4k_pop /dev/shm populate 1
mnt=/mnt/pegaflow-thp
mkdir -p $mnt
if mount -t tmpfs -o huge=always,size=$(( bytes / 1073741824 + 4 ))g pegaflow-thp $mnt 2>>"$log"; then
  case_on thp $mnt "" 1
  case_on thp_pop $mnt populate 1
  case_on thp_two $mnt populate 2
  umount $mnt
else
  echo "tmpfs huge=always: mount refused" | tee -a "$log"
fi
was=$(cat /proc/sys/vm/nr_hugepages)
want=$(( bytes / 2097152 + 16 ))
if echo $want > /proc/sys/vm/nr_hugepages 2>>"$log"; then
  got=$(cat /proc/sys/vm/nr_hugepages)
  echo "nr_hugepages: $was -> $got (asked $want)" | tee -a "$log"
  mnt=/mnt/pegaflow-hugetlb
  mkdir -p $mnt
  if [ "$got" -ge $(( bytes / 2097152 )) ] && mount -t hugetlbfs -o pagesize=2M pegaflow-hugetlb $mnt 2>>"$log"; then
    case_on hugetlb $mnt populate 1
    case_on hugetlb_nopop $mnt "" 1
    umount $mnt
  fi
  echo "$was" > /proc/sys/vm/nr_hugepages
  echo "nr_hugepages back to $(cat /proc/sys/vm/nr_hugepages)" | tee -a "$log"
else
  echo "vm.nr_hugepages not writable" | tee -a "$log"
fi
echo "$json}" > "$out/attach-probe.json"
cat "$out/attach-probe.json"
