#!/usr/bin/env bash
# scripts/gpu_check.sh OUTDIR [--dry-run | --plan]: the prepared check for a GPU machine without
# network, named so in README and the contract; it lives beside its Python in tools/gpu_check/
# (--help there says what it does).
exec "$(cd "$(dirname "$0")/.." && pwd)/tools/gpu_check/gpu_check.sh" "$@"
