// Package releasetest checks what `make release-snapshot`
// (scripts/release.sh snapshot) builds, the same set the release workflow
// publishes from a tag: every binary runs (linux/amd64 natively, linux/arm64
// under qemu) or, for darwin, carries the right build information; the
// SBOMs describe them; checksums.txt verifies; the image archive is an
// index of linux/amd64 and linux/arm64 whose images start; the gem, the
// Python sdist and wheel and the npm tarball install and load; every archive
// carries the manifests (deploy/) and docs/, from which the production
// overlay and the Flux example render; the chart is packaged at the
// release's version and as the OCI artifact the workflow pushes and signs;
// the image has a CycloneDX SBOM per architecture; all of the one version
// scripts/buildinfo.sh gives. TestReleaseWorkflow checks that the workflow
// runs CI's checks before publishing, and the steps that push and sign.
//
// It builds everything once (a few minutes on two cores with a cold Go
// build cache, much less with a warm one) and needs buildah, podman and
// runc (scripts/ensure-buildah.sh), qemu-user-static
// (scripts/ensure-qemu.sh) and Debian's ruby, python3-build and npm
// (scripts/ensure-runtimes.sh); with CI=true a missing one fails it.
package releasetest
