// Package imagetest builds idemd's container image offline
// (scripts/build-image.sh: buildah, FROM scratch, nothing pulled) and runs
// every command from it with podman the way Kubernetes runs the manifests:
// read-only root file system, uid 65532, no capabilities added. Its tests
// need buildah, podman and runc (scripts/ensure-buildah.sh installs them);
// without them they skip, and with CI=true they fail.
//
// podman runs on runc (--runtime runc) with explicit ulimits: on this
// machine kind crun, podman's default, cannot set RLIMIT_NOFILE.
package imagetest
