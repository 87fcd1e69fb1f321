#!/usr/bin/env bash
# Cloud TPU VMs for bert_jax: create, set up, run, follow, stop and delete, on one host or a pod slice.
# `launch_tpu.sh --help` for the commands; `--dry-run` prints the gcloud commands without running them.
set -euo pipefail

USAGE="Usage: launch_tpu.sh [--dry-run] COMMAND --name=NAME --zone=ZONE [--project=PROJECT] [OPTIONS] [-- ARGS]

Cloud TPU VMs (one host or a pod slice) for bert_jax. Commands:
  create   Create the TPU VM.
             --accelerator-type=TYPE  e.g. v3-32, v4-32 (required)
             --version=RUNTIME        TPU software version, e.g. tpu-ubuntu2204-base (required)
             --queued                 request it as a queued resource (waits for capacity)
             --spot | --preemptible   spot capacity; --preemptible only without --queued
  setup    On every worker: copy this working tree (git-tracked and untracked, not ignored
           files) or clone --repo, make a venv, pip install -r requirements-tpu.txt.
             --repo=URL [--branch=REF] clone (or pull) URL instead of copying this tree
             --python=PYTHON          interpreter of the venv, >= 3.11 (default python3.11;
                                      installed with apt when missing)
             --gcs-bucket=BUCKET      also mount gs://BUCKET at /mnt/gcs/BUCKET (gcsfuse)
  run      On every worker, in the background (survives ssh disconnects):
           python -m bert_jax.main ARGS, where ARGS is everything after --, passed verbatim.
           Output is appended to ~/REMOTE_DIR/logs/run.log on each worker.
             --env=KEY=VALUE          an environment variable for the run (repeatable)
  logs     Print the end of a worker's log.
             --worker=N (default 0)   --lines=N (default 100)   --follow
  stop     Stop the run on every worker (SIGTERM to its process group).
             --vm                     stop the TPU VM instead (single-host TPUs only)
  delete   Delete the TPU VM.
             --queued                 delete the queued resource and its TPU VM
             --yes                    do not ask for confirmation

Options of every command:
  --name=NAME          TPU VM (and queued resource) name (required)
  --zone=ZONE          e.g. europe-west4-a (required)
  --project=PROJECT    default: the gcloud configuration's project
  --remote-dir=DIR     checkout on the workers, relative to the home directory (default bert_jax)
  --dry-run            print each command, prefixed '+ ', instead of running it

Example:
  ./launch_tpu.sh run --name=bert --zone=europe-west4-a -- --config=configs/base.py \\
    --workdir=gs://my-bucket/base --config.data.corpus='/mnt/gcs/my-bucket/wiki/*.txt'"

# Options each command accepts, besides --name, --zone, --project, --remote-dir and --dry-run.
command_options() {
  case "$1" in
    create) echo 'accelerator-type version queued spot preemptible' ;;
    setup) echo 'repo branch python gcs-bucket' ;;
    run) echo 'env' ;;
    logs) echo 'worker lines follow' ;;
    stop) echo 'vm' ;;
    delete) echo 'queued yes' ;;
  esac
}

die() {
  printf 'launch_tpu.sh: %s\n' "$1" >&2
  if [[ "${2:-}" == usage ]]; then
    printf "Run 'launch_tpu.sh --help' for the commands and options.\n" >&2
  fi
  exit 2
}

# Quotes one word for a POSIX shell: bare when safe, else in single quotes.
quote() {
  if [[ "$1" =~ ^[A-Za-z0-9_./:=@%+,-]+$ ]]; then
    printf '%s' "$1"
  else
    printf "'%s'" "${1//\'/\'\\\'\'}"
  fi
}

# Quotes every argument and joins them with spaces.
quote_all() {
  local out='' arg
  for arg in "$@"; do
    out+="${out:+ }$(quote "$arg")"
  done
  printf '%s' "$out"
}

# Runs a command, or only prints it under --dry-run; either way it is shown as '+ COMMAND'.
run_cmd() {
  if ((DRY_RUN)); then
    printf '+ %s\n' "$(quote_all "$@")"
  else
    printf '+ %s\n' "$(quote_all "$@")" >&2
    "$@"
  fi
}

# Runs a shell command line on the given worker(s) of the TPU VM.
tpu_ssh() {
  run_cmd gcloud compute tpus tpu-vm ssh "$NAME" "${GCLOUD_FLAGS[@]}" "--worker=$1" "--command=$2"
}

# ---------------------------------------------------------------------------------------------
# Arguments.

DRY_RUN=0
COMMAND=''
NAME='' ZONE='' PROJECT='' REMOTE_DIR='bert_jax'
ACCELERATOR_TYPE='' VERSION='' QUEUED=0 SPOT=0 PREEMPTIBLE=0
REPO='' BRANCH='' PYTHON='python3.11' GCS_BUCKET=''
WORKER='0' LINES='100' FOLLOW=0 VM=0 YES=0
RUN_ENV=()
PASSTHROUGH=()
SEEN=()

while (($#)); do
  arg="$1"
  shift
  case "$arg" in
    -h | --help)
      printf '%s\n' "$USAGE"
      exit 0
      ;;
    --)
      PASSTHROUGH=("$@")
      break
      ;;
    --dry-run) DRY_RUN=1 ;;
    --queued | --spot | --preemptible | --follow | --vm | --yes)
      SEEN+=("${arg#--}")
      case "$arg" in
        --queued) QUEUED=1 ;;
        --spot) SPOT=1 ;;
        --preemptible) PREEMPTIBLE=1 ;;
        --follow) FOLLOW=1 ;;
        --vm) VM=1 ;;
        --yes) YES=1 ;;
      esac
      ;;
    --*)
      option="${arg%%=*}"
      option="${option#--}"
      case "$option" in
        name | zone | project | remote-dir | accelerator-type | version | repo | branch | python | \
          gcs-bucket | env | worker | lines) ;;
        *) die "unknown option '$arg'." usage ;;
      esac
      if [[ "$arg" == *=* ]]; then
        value="${arg#*=}"
      elif (($#)) && [[ "$1" != --* ]]; then
        value="$1"
        shift
      else
        die "--$option needs a value: --$option=VALUE." usage
      fi
      [[ -n "$value" ]] || die "--$option is empty." usage
      SEEN+=("$option")
      case "$option" in
        name) NAME="$value" ;;
        zone) ZONE="$value" ;;
        project) PROJECT="$value" ;;
        remote-dir) REMOTE_DIR="$value" ;;
        accelerator-type) ACCELERATOR_TYPE="$value" ;;
        version) VERSION="$value" ;;
        repo) REPO="$value" ;;
        branch) BRANCH="$value" ;;
        python) PYTHON="$value" ;;
        gcs-bucket) GCS_BUCKET="$value" ;;
        env)
          [[ "$value" =~ ^[A-Za-z_][A-Za-z0-9_]*= ]] || die "--env=$value: expected KEY=VALUE."
          RUN_ENV+=("$value")
          ;;
        worker) WORKER="$value" ;;
        lines) LINES="$value" ;;
      esac
      ;;
    *)
      [[ -z "$COMMAND" ]] || die "unexpected argument '$arg' (the bert_jax flags go after --)." usage
      COMMAND="$arg"
      ;;
  esac
done

[[ -n "$COMMAND" ]] || die "no command given: create, setup, run, logs, stop or delete." usage
case "$COMMAND" in
  create | setup | run | logs | stop | delete) ;;
  *) die "unknown command '$COMMAND'; expected create, setup, run, logs, stop or delete." usage ;;
esac
allowed=" name zone project remote-dir $(command_options "$COMMAND") "
for option in ${SEEN[@]+"${SEEN[@]}"}; do
  [[ "$allowed" == *" $option "* ]] || die "--$option does not apply to '$COMMAND'." usage
done
if ((${#PASSTHROUGH[@]})) && [[ "$COMMAND" != run ]]; then
  die "only 'run' takes arguments after --." usage
fi

missing=()
[[ -n "$NAME" ]] || missing+=(--name)
[[ -n "$ZONE" ]] || missing+=(--zone)
if [[ "$COMMAND" == create ]]; then
  [[ -n "$ACCELERATOR_TYPE" ]] || missing+=(--accelerator-type)
  [[ -n "$VERSION" ]] || missing+=(--version)
fi
if ((${#missing[@]})); then
  die "'$COMMAND' needs ${missing[*]}." usage
fi
[[ "$REMOTE_DIR" =~ ^[A-Za-z0-9_][A-Za-z0-9_./-]*$ && "$REMOTE_DIR" != *..* ]] ||
  die "--remote-dir=$REMOTE_DIR must be a plain path under the home directory."
[[ -z "$GCS_BUCKET" || "$GCS_BUCKET" =~ ^[a-z0-9][a-z0-9._-]*$ ]] ||
  die "--gcs-bucket=$GCS_BUCKET: give the bucket's name, without gs://."
[[ "$WORKER" =~ ^[0-9]+$ ]] || die "--worker=$WORKER must be one worker's number (0, 1, ...)."
[[ "$LINES" =~ ^[0-9]+$ ]] || die "--lines=$LINES must be a number."
((SPOT + PREEMPTIBLE < 2)) || die "--spot and --preemptible exclude each other."
if ((QUEUED && PREEMPTIBLE)); then
  die "queued resources take --spot, not --preemptible."
fi
[[ -z "$BRANCH" || -n "$REPO" ]] || die "--branch needs --repo."

GCLOUD_FLAGS=("--zone=$ZONE")
[[ -z "$PROJECT" ]] || GCLOUD_FLAGS+=("--project=$PROJECT")
DIR="$REMOTE_DIR"  # Plain characters only (checked above): safe in remote commands as it is.
# On each worker, DIR/logs/run.log collects the runs' output and DIR/logs/run.pid names the last
# run's process; it is alive while that process is.
# shellcheck disable=SC2016  # Expanded on the worker, not here.
ALIVE='[ -f logs/run.pid ] && kill -0 "$(cat logs/run.pid)" 2>/dev/null'

# ---------------------------------------------------------------------------------------------
# Commands.

create() {
  local capacity=()
  if ((SPOT)); then
    capacity=(--spot)
  elif ((PREEMPTIBLE)); then
    capacity=(--preemptible)
  fi
  if ((QUEUED)); then
    run_cmd gcloud compute tpus queued-resources create "$NAME" "${GCLOUD_FLAGS[@]}" \
      "--accelerator-type=$ACCELERATOR_TYPE" "--runtime-version=$VERSION" "--node-id=$NAME" \
      ${capacity[@]+"${capacity[@]}"}
    if ((!DRY_RUN)); then
      echo "Queued. The TPU VM '$NAME' exists once this shows ACTIVE:" >&2
      echo "  gcloud compute tpus queued-resources describe $NAME ${GCLOUD_FLAGS[*]}" >&2
    fi
  else
    run_cmd gcloud compute tpus tpu-vm create "$NAME" "${GCLOUD_FLAGS[@]}" \
      "--accelerator-type=$ACCELERATOR_TYPE" "--version=$VERSION" ${capacity[@]+"${capacity[@]}"}
  fi
}

# Copies the files git would see (tracked and untracked, not ignored) to every worker.
copy_working_tree() {
  local root
  root="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
  tarball="${TMPDIR:-/tmp}/bert_jax_$$.tar.gz"  # Global: the EXIT trap removes it.
  if ((DRY_RUN)); then
    printf '+ %s | tar -C %s --null -T - -czf %s\n' \
      "$(quote_all git -C "$root" ls-files -z --cached --others --exclude-standard)" \
      "$(quote "$root")" "$(quote "$tarball")"
  else
    trap 'rm -f "$tarball"' EXIT
    git -C "$root" ls-files -z --cached --others --exclude-standard |
      (cd "$root" && while IFS= read -r -d '' file; do
        if [[ -e "$file" ]]; then # Tracked but deleted files are skipped.
          printf '%s\0' "$file"
        fi
      done) | tar -C "$root" --null -T - -czf "$tarball"
  fi
  run_cmd gcloud compute tpus tpu-vm scp "$tarball" "$NAME:bert_jax.tar.gz" "${GCLOUD_FLAGS[@]}" \
    --worker=all
  tpu_ssh all "mkdir -p $DIR && tar -xzf bert_jax.tar.gz -C $DIR && rm bert_jax.tar.gz"
}

setup() {
  local steps=('set -eu') python
  python="$(quote "$PYTHON")"
  if [[ -n "$REPO" ]]; then
    steps+=("[ -d $DIR/.git ] || git clone -q $(quote "$REPO") $DIR" "cd $DIR")
    if [[ -n "$BRANCH" ]]; then
      steps+=("git fetch -q origin" "git checkout -q $(quote "$BRANCH")")
      steps+=("if git symbolic-ref -q HEAD >/dev/null; then git pull -q --ff-only; fi")
    else
      steps+=("git pull -q --ff-only")
    fi
  else
    copy_working_tree
    steps+=("cd $DIR")
  fi
  if [[ "$PYTHON" =~ ^python3\.[0-9]+$ ]]; then
    steps+=("command -v $python >/dev/null || { sudo apt-get update -q && sudo apt-get install -y -q $python $python-venv; }")
  fi
  steps+=("[ -x .venv/bin/python ] || $python -m venv .venv")
  steps+=(".venv/bin/pip install -q --upgrade pip" ".venv/bin/pip install -q -r requirements-tpu.txt")
  if [[ -n "$GCS_BUCKET" ]]; then
    local mount="/mnt/gcs/$GCS_BUCKET"
    # Cloud Storage FUSE from Google's apt repository. Directory renames must be allowed:
    # orbax completes a checkpoint by renaming its temporary directory.
    steps+=("command -v gcsfuse >/dev/null || { curl -fsSL https://packages.cloud.google.com/apt/doc/apt-key.gpg | sudo tee /usr/share/keyrings/cloud.google.asc >/dev/null && echo \"deb [signed-by=/usr/share/keyrings/cloud.google.asc] https://packages.cloud.google.com/apt gcsfuse-\$(lsb_release -cs) main\" | sudo tee /etc/apt/sources.list.d/gcsfuse.list >/dev/null && sudo apt-get update -q && sudo apt-get install -y -q gcsfuse; }")
    steps+=("sudo mkdir -p $mount && sudo chown \"\$(id -u):\$(id -g)\" $mount")
    steps+=("mountpoint -q $mount || gcsfuse --implicit-dirs --rename-dir-limit=1000000 $GCS_BUCKET $mount")
  fi
  steps+=("echo \"\$(hostname): bert_jax is set up in ~/$DIR\"")
  local script
  script="$(printf '%s; ' "${steps[@]}")"
  tpu_ssh all "${script%; }"
}

run() {
  if ((!${#PASSTHROUGH[@]})); then
    die "'run' needs the bert_jax flags after --, e.g. -- --config=configs/base.py --workdir=DIR." usage
  fi
  local arg
  for arg in "${PASSTHROUGH[@]}"; do
    # A gs:// workdir and init_from work as they are; a prepared corpus is read from local files
    # (bert_jax refuses it too, but only once every worker has started).
    [[ "$arg" != --config.data.prepared=gs://* ]] || die "$arg: a prepared corpus is read from \
a local path; mount the bucket (setup --gcs-bucket=BUCKET) and give /mnt/gcs/BUCKET/... instead."
  done
  local main command
  main="$(quote_all .venv/bin/python -m bert_jax.main "${PASSTHROUGH[@]}")"
  command="$main"
  if ((${#RUN_ENV[@]})); then
    command="env $(quote_all "${RUN_ENV[@]}") $main"
  fi
  # bert_jax/main.py calls jax.distributed.initialize() when BERT_JAX_MULTIHOST=1; CLOUD_TPU_TASK_ID
  # is the worker's number, and JAX reads the rest of the slice from the TPU VM's metadata.
  # shellcheck disable=SC2016  # $(...) and $worker expand on the worker, not here.
  local steps=(
    'set -eu' "cd $DIR" 'mkdir -p logs'
    "if $ALIVE; then echo \"\$(hostname): a run is still going (pid \$(cat logs/run.pid)); stop it first.\" >&2; exit 1; fi"
    'worker="$(curl -sf -m 10 -H Metadata-Flavor:Google http://metadata.google.internal/computeMetadata/v1/instance/attributes/agent-worker-number || echo 0)"'
    "printf '=== %s worker %s: %s\\n' \"\$(date -u)\" \"\$worker\" $(quote "$command") >> logs/run.log"
    "BERT_JAX_MULTIHOST=1 CLOUD_TPU_TASK_ID=\"\$worker\" setsid nohup $command >> logs/run.log 2>&1 < /dev/null & echo \$! > logs/run.pid"
    "echo \"worker \$worker: started pid \$(cat logs/run.pid), log ~/$DIR/logs/run.log\""
  )
  local script
  script="$(printf '%s; ' "${steps[@]}")"
  tpu_ssh all "${script%; }"
}

logs() {
  local follow=''
  if ((FOLLOW)); then
    follow=' -F'
  fi
  tpu_ssh "$WORKER" "tail -n $LINES$follow $DIR/logs/run.log"
}

stop() {
  if ((VM)); then
    run_cmd gcloud compute tpus tpu-vm stop "$NAME" "${GCLOUD_FLAGS[@]}"
    return
  fi
  # The run is the leader of its own process group (setsid): the group goes.
  tpu_ssh all "cd $DIR && if $ALIVE; then kill -TERM -- \"-\$(cat logs/run.pid)\" && echo \"\$(hostname): stopped the run\"; else echo \"\$(hostname): no run is going\"; fi"
}

delete() {
  local confirm=()
  if ((YES)); then
    confirm=(--quiet)
  fi
  if ((QUEUED)); then
    run_cmd gcloud compute tpus queued-resources delete "$NAME" "${GCLOUD_FLAGS[@]}" --force \
      ${confirm[@]+"${confirm[@]}"}
  else
    run_cmd gcloud compute tpus tpu-vm delete "$NAME" "${GCLOUD_FLAGS[@]}" \
      ${confirm[@]+"${confirm[@]}"}
  fi
}

"$COMMAND"
