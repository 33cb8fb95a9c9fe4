#!/bin/sh
# Regenerates the Python messages (*_pb2.py) and gRPC stubs (*_pb2_grpc.py) of
# proto/sessionstate/v1 into clients/python/sessionstate/v1 (committed; `npm run generate`
# runs this after buf generate). Needs Debian's protobuf-compiler and protobuf-compiler-grpc
# (`grpc_tools` from pip works too: see README.md).
set -eu
here=$(cd "$(dirname "$0")" && pwd)
root=$(cd "$here/../.." && pwd)
if ! command -v protoc >/dev/null 2>&1 || ! command -v grpc_python_plugin >/dev/null 2>&1; then
  echo "clients/python/generate.sh: protoc and grpc_python_plugin are needed:" >&2
  echo "  apt-get install protobuf-compiler protobuf-compiler-grpc libprotobuf-dev" >&2
  exit 1
fi
# protoc finds the well-known types next to itself (../include); Debian ships them apart.
wkt="$(dirname "$(command -v protoc)")/../include/google/protobuf/timestamp.proto"
if [ ! -f "$wkt" ]; then
  echo "clients/python/generate.sh: protoc's well-known types (google/protobuf/timestamp.proto) are missing:" >&2
  echo "  apt-get install libprotobuf-dev" >&2
  exit 1
fi
out="$here/sessionstate/v1"
rm -f "$out"/*_pb2.py "$out"/*_pb2_grpc.py
mkdir -p "$out"
cd "$root/proto"
protoc -I . \
  --python_out="$here" \
  --grpc_python_out="$here" \
  --plugin=protoc-gen-grpc_python="$(command -v grpc_python_plugin)" \
  sessionstate/v1/*.proto
: > "$out/__init__.py"
