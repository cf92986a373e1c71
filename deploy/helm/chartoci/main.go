// Command chartoci writes a packaged chart (`helm package`'s .tgz) as the
// OCI artifact `helm push` makes of it (Helm's config and chart layer media
// types, its manifest annotations) into an OCI image layout directory, so
// that an offline release builds the very artifact its workflow copies to
// the registry and signs (scripts/release.sh, .github/workflows/release.yml).
//
//	chartoci -chart idemd-0.2.0.tgz -layout DIR -created 2026-12-07T12:00:00Z
//
// It prints the manifest's digest. The tag is the chart's version with "+"
// as "_", as Helm tags it.
package main

import (
	"bytes"
	"context"
	"encoding/json"
	"flag"
	"fmt"
	"os"
	"strings"
	"time"

	specs "github.com/opencontainers/image-spec/specs-go"
	ocispec "github.com/opencontainers/image-spec/specs-go/v1"
	"helm.sh/helm/v4/pkg/chart/v2/loader"
	"helm.sh/helm/v4/pkg/registry"
	"oras.land/oras-go/v2"
	"oras.land/oras-go/v2/content/oci"
)

func main() {
	chartPath := flag.String("chart", "", "the packaged chart (.tgz)")
	layout := flag.String("layout", "", "the OCI image layout directory to write")
	created := flag.String("created", "", "the artifact's creation time, RFC 3339 (the release's commit time: the same input gives the same digest)")
	flag.Parse()
	if *chartPath == "" || *layout == "" || *created == "" {
		fmt.Fprintln(os.Stderr, "usage: chartoci -chart FILE.tgz -layout DIR -created RFC3339")
		os.Exit(2)
	}
	digest, err := run(context.Background(), *chartPath, *layout, *created)
	if err != nil {
		fmt.Fprintln(os.Stderr, "chartoci:", err)
		os.Exit(1)
	}
	fmt.Println(digest)
}

func run(ctx context.Context, chartPath, layout, created string) (string, error) {
	if _, err := time.Parse(time.RFC3339, created); err != nil {
		return "", fmt.Errorf("created %q: %w", created, err)
	}
	data, err := os.ReadFile(chartPath)
	if err != nil {
		return "", fmt.Errorf("read chart: %w", err)
	}
	ch, err := loader.LoadArchive(bytes.NewReader(data))
	if err != nil {
		return "", fmt.Errorf("load chart %s: %w", chartPath, err)
	}
	meta := ch.Metadata
	store, err := oci.New(layout)
	if err != nil {
		return "", fmt.Errorf("open layout %s: %w", layout, err)
	}
	layer, err := oras.PushBytes(ctx, store, registry.ChartLayerMediaType, data)
	if err != nil {
		return "", fmt.Errorf("write chart layer: %w", err)
	}
	configData, err := json.Marshal(meta)
	if err != nil {
		return "", fmt.Errorf("encode chart metadata: %w", err)
	}
	config, err := oras.PushBytes(ctx, store, registry.ConfigMediaType, configData)
	if err != nil {
		return "", fmt.Errorf("write config: %w", err)
	}
	// The annotations Helm's registry client puts on a chart's manifest
	// (helm.sh/helm/v4/pkg/registry, generateChartOCIAnnotations).
	annotations := map[string]string{
		ocispec.AnnotationTitle:   meta.Name,
		ocispec.AnnotationVersion: meta.Version,
		ocispec.AnnotationCreated: created,
	}
	if meta.Description != "" {
		annotations[ocispec.AnnotationDescription] = meta.Description
	}
	if meta.Home != "" {
		annotations[ocispec.AnnotationURL] = meta.Home
	}
	if len(meta.Sources) > 0 {
		annotations[ocispec.AnnotationSource] = meta.Sources[0]
	}
	if len(meta.Maintainers) > 0 {
		return "", fmt.Errorf("chart %s has maintainers: add Helm's org.opencontainers.image.authors annotation here", meta.Name)
	}
	// The chart's own annotations, never over the ones above.
	for k, v := range meta.Annotations {
		if _, set := annotations[k]; !set {
			annotations[k] = v
		}
	}
	manifest := ocispec.Manifest{
		Versioned:   specs.Versioned{SchemaVersion: 2},
		Config:      config,
		Layers:      []ocispec.Descriptor{layer},
		Annotations: annotations,
	}
	manifestData, err := json.Marshal(manifest)
	if err != nil {
		return "", fmt.Errorf("encode manifest: %w", err)
	}
	tag := strings.ReplaceAll(meta.Version, "+", "_")
	desc, err := oras.TagBytes(ctx, store, ocispec.MediaTypeImageManifest, manifestData, tag)
	if err != nil {
		return "", fmt.Errorf("write manifest %s: %w", tag, err)
	}
	return desc.Digest.String(), nil
}
