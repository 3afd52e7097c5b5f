package main

import (
	"encoding/json"
	"fmt"
	"regexp"
	"runtime/debug"
	"sort"
	"strings"
)

// SPDX 2.3 JSON, the fields written (https://spdx.github.io/spdx-spec/v2.3/).
type spdxDoc struct {
	SPDXVersion       string             `json:"spdxVersion"`
	DataLicense       string             `json:"dataLicense"`
	SPDXID            string             `json:"SPDXID"`
	Name              string             `json:"name"`
	DocumentNamespace string             `json:"documentNamespace"`
	CreationInfo      spdxCreation       `json:"creationInfo"`
	Packages          []spdxPackage      `json:"packages"`
	Relationships     []spdxRelationship `json:"relationships"`
}

type spdxCreation struct {
	Created  string   `json:"created"`
	Creators []string `json:"creators"`
}

type spdxPackage struct {
	Name             string         `json:"name"`
	SPDXID           string         `json:"SPDXID"`
	VersionInfo      string         `json:"versionInfo,omitempty"`
	Supplier         string         `json:"supplier,omitempty"`
	DownloadLocation string         `json:"downloadLocation"`
	FilesAnalyzed    bool           `json:"filesAnalyzed"`
	LicenseConcluded string         `json:"licenseConcluded"`
	LicenseDeclared  string         `json:"licenseDeclared"`
	CopyrightText    string         `json:"copyrightText"`
	Checksums        []spdxChecksum `json:"checksums,omitempty"`
	ExternalRefs     []spdxRef      `json:"externalRefs,omitempty"`
	Comment          string         `json:"comment,omitempty"`
	Purpose          string         `json:"primaryPackagePurpose,omitempty"`
}

type spdxChecksum struct {
	Algorithm string `json:"algorithm"`
	Value     string `json:"checksumValue"`
}

type spdxRef struct {
	Category string `json:"referenceCategory"`
	Type     string `json:"referenceType"`
	Locator  string `json:"referenceLocator"`
}

type spdxRelationship struct {
	Element string `json:"spdxElementId"`
	Type    string `json:"relationshipType"`
	Related string `json:"relatedSpdxElement"`
}

// sbomInput is what an image holds, for its SBOM.
type sbomInput struct {
	Image   string // mdag, mdag-lean, mdag-torch-runner
	Version string // the source stamp
	Digest  string // the manifest's, sha256:...
	Debs    []*debPackage
	Go      *debug.BuildInfo // the mdag binary's; nil in the runner image
	Other   []spdxPackage    // ONNX Runtime, the runner's sources, a base image
}

var spdxIDChars = regexp.MustCompile(`[^A-Za-z0-9.-]+`)

func spdxID(kind, name string) string {
	return "SPDXRef-" + kind + "-" + strings.Trim(spdxIDChars.ReplaceAllString(name, "-"), "-")
}

// SBOM is the SPDX document of an image: the image as the package the
// document describes, containing every Debian package (name, version,
// architecture, a purl), every Go module of the binary (from its build
// info) and the other files given. It is a function of its input: the
// document namespace is derived from the image digest, the creation time
// is the epoch of the build.
func SBOM(in sbomInput, created string) ([]byte, error) {
	if !strings.HasPrefix(in.Digest, "sha256:") {
		return nil, fmt.Errorf("sbom of %s: digest %q is not sha256:...", in.Image, in.Digest)
	}
	hexd := strings.TrimPrefix(in.Digest, "sha256:")
	root := spdxID("image", in.Image)
	doc := spdxDoc{
		SPDXVersion: "SPDX-2.3", DataLicense: "CC0-1.0", SPDXID: "SPDXRef-DOCUMENT",
		Name:              in.Image + "@" + in.Digest,
		DocumentNamespace: "https://github.com/mdag/mdag/spdx/" + in.Image + "/sha256-" + hexd,
		CreationInfo:      spdxCreation{Created: created, Creators: []string{"Tool: mdag-mkimage (tools/mkimage)"}},
		Packages: []spdxPackage{{
			Name: in.Image, SPDXID: root, VersionInfo: in.Version, DownloadLocation: "NOASSERTION",
			LicenseConcluded: "NOASSERTION", LicenseDeclared: "NOASSERTION", CopyrightText: "NOASSERTION",
			Checksums:    []spdxChecksum{{Algorithm: "SHA256", Value: hexd}},
			ExternalRefs: []spdxRef{{Category: "PACKAGE-MANAGER", Type: "purl", Locator: "pkg:oci/" + in.Image + "@" + strings.Replace(in.Digest, ":", "%3A", 1)}},
			Purpose:      "CONTAINER",
		}},
		Relationships: []spdxRelationship{{Element: "SPDXRef-DOCUMENT", Type: "DESCRIBES", Related: root}},
	}
	var pkgs []spdxPackage
	for _, d := range in.Debs {
		pkgs = append(pkgs, spdxPackage{
			Name: d.Name, SPDXID: spdxID("deb", d.Name+"-"+d.Arch), VersionInfo: d.Version, Supplier: "Organization: Debian",
			DownloadLocation: "NOASSERTION", LicenseConcluded: "NOASSERTION", LicenseDeclared: "NOASSERTION", CopyrightText: "NOASSERTION",
			ExternalRefs: []spdxRef{{Category: "PACKAGE-MANAGER", Type: "purl",
				Locator: "pkg:deb/debian/" + d.Name + "@" + strings.ReplaceAll(d.Version, ":", "%3A") + "?arch=" + d.Arch + "&distro=debian-12"}},
			Comment: "architecture " + d.Arch + "; licence in /usr/share/doc/" + d.Name + "/copyright",
		})
	}
	if in.Go != nil {
		mods := append([]*debug.Module{&in.Go.Main}, in.Go.Deps...)
		for _, m := range mods {
			if m.Replace != nil {
				m = m.Replace
			}
			v := m.Version
			p := spdxPackage{
				Name: m.Path, SPDXID: spdxID("go", m.Path+"-"+v), VersionInfo: v, DownloadLocation: "NOASSERTION",
				LicenseConcluded: "NOASSERTION", LicenseDeclared: "NOASSERTION", CopyrightText: "NOASSERTION",
				ExternalRefs: []spdxRef{{Category: "PACKAGE-MANAGER", Type: "purl", Locator: "pkg:golang/" + m.Path + "@" + v}},
			}
			if m.Sum != "" {
				p.Comment = "go.sum " + m.Sum
			}
			if m == &in.Go.Main {
				p.Comment = "the main module (" + in.Go.GoVersion + ")"
			}
			pkgs = append(pkgs, p)
		}
	}
	pkgs = append(pkgs, in.Other...)
	sort.SliceStable(pkgs, func(i, j int) bool { return pkgs[i].SPDXID < pkgs[j].SPDXID })
	seen := map[string]bool{}
	for _, p := range pkgs {
		if seen[p.SPDXID] {
			continue // one Go module listed twice (main module and a replace)
		}
		seen[p.SPDXID] = true
		doc.Packages = append(doc.Packages, p)
		doc.Relationships = append(doc.Relationships, spdxRelationship{Element: root, Type: "CONTAINS", Related: p.SPDXID})
	}
	b, err := json.MarshalIndent(doc, "", "  ")
	if err != nil {
		return nil, err
	}
	return append(b, '\n'), nil
}
