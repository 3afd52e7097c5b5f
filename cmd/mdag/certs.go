package main

import (
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"time"

	"github.com/mdag/mdag/internal/pki"
)

// runCerts is `mdag certs init|issue`: the CA and the certificates of
// mutual TLS on the coordinator's gRPC port.
func runCerts(args []string, stdout, stderr io.Writer) int {
	usage := func(w io.Writer) {
		fmt.Fprintln(w, "Usage: mdag certs init --dir DIR [--hosts NAMES] [--valid D] [--force]")
		fmt.Fprintln(w, "       mdag certs issue --dir DIR --role coordinator|worker|source [--name NAME] [--hosts NAMES] [--out DIR] [--valid D] [--force]")
		fmt.Fprintln(w, "\ninit creates a CA (ca.pem, ca-key.pem) and one certificate per role (coordinator.pem, worker.pem, source.pem,")
		fmt.Fprintln(w, "each with ROLE-key.pem) in DIR; issue signs another with DIR's CA. Keys are written 0600. Run 'mdag certs init -h'.")
	}
	if len(args) == 0 {
		usage(stderr)
		return exitInvalid
	}
	switch args[0] {
	case "init":
		return runCertsInit(args[1:], stdout, stderr)
	case "issue":
		return runCertsIssue(args[1:], stdout, stderr)
	case "-h", "--help", "help":
		usage(stdout)
		return exitOK
	}
	fmt.Fprintf(stderr, "mdag certs: unknown subcommand %q: want init or issue\n", args[0])
	usage(stderr)
	return exitInvalid
}

func runCertsInit(args []string, stdout, stderr io.Writer) int {
	fs := newFlags("certs init", "--dir DIR [flags]", stderr)
	dir := fs.String("dir", "", "directory to create the CA and certificates in (required; created 0700)")
	hosts := fs.String("hosts", pki.DefaultHosts, "the coordinator certificate's DNS names and IPs, comma-separated: every name workers and sources dial it by")
	valid := fs.Duration("valid", pki.DefaultCertValid, "how long the certificates are valid (the CA: 10 years)")
	force := fs.Bool("force", false, "replace existing files: a new CA, so every certificate the old one issued (mdag certs issue's too) stops being trusted "+
		"and every peer needs new files (to replace one certificate, keep the CA: mdag certs issue --force)")
	if code, ok := parseFlags(fs, args); !ok {
		return code
	}
	if *dir == "" {
		fmt.Fprintln(stderr, "mdag certs init: --dir is required")
		return exitInvalid
	}
	if *valid <= 0 {
		fmt.Fprintf(stderr, "mdag certs init: --valid %v: want > 0\n", *valid)
		return exitInvalid
	}
	if exist := existingCAFiles(*dir); len(exist) > 0 && !*force {
		fmt.Fprintf(stderr, "mdag certs init: refusing to overwrite %s: %s has a CA already.\n"+
			"  --force makes a new CA: every certificate the old one issued (these and every --out directory of mdag certs issue) stops being trusted,\n"+
			"  and the coordinator, every worker and every source need the new files before they can connect again.\n"+
			"  To replace one certificate and keep the CA: mdag certs issue --dir %s --role coordinator|worker|source [--name NAME] [--out DIR] --force\n",
			strings.Join(exist, ", "), *dir, *dir)
		return exitInvalid
	}
	if root := gitWorkTree(*dir); root != "" && !gitIgnored(root, *dir) {
		fmt.Fprintf(stderr, "mdag certs init: warning: %s is inside the git work tree %s and not ignored by it: %s signs every certificate; "+
			"keep it out of commits (add %s/ to .gitignore) or use a directory outside the repository\n",
			*dir, root, filepath.Join(*dir, pki.CAKeyFile), filepath.Clean(*dir))
	}
	wrote, err := pki.Init(*dir, pki.InitOptions{Hosts: *hosts, Now: time.Now(), Valid: *valid, Force: *force})
	if err != nil {
		fmt.Fprintf(stderr, "mdag certs init: %v\n", err)
		return exitInvalid
	}
	for _, f := range wrote {
		fmt.Fprintln(stdout, "wrote", f)
	}
	fmt.Fprintf(stdout, "the coordinator's certificate names %s; run coordinator, workers and sources with --tls-dir %s\n", *hosts, *dir)
	fmt.Fprintf(stdout, "keep %s/ca-key.pem off the servers: only mdag certs issue needs it\n", *dir)
	return exitOK
}

// existingCAFiles are the files of mdag certs init already in dir.
func existingCAFiles(dir string) []string {
	names := []string{pki.CAFile, pki.CAKeyFile}
	for _, r := range pki.Roles {
		names = append(names, string(r)+".pem", string(r)+"-key.pem")
	}
	var exist []string
	for _, n := range names {
		p := filepath.Join(dir, n)
		if _, err := os.Lstat(p); err == nil {
			exist = append(exist, p)
		}
	}
	return exist
}

// gitWorkTree is the root of the git work tree dir is in ("" when none):
// the nearest directory at or above it (dir need not exist yet) with a
// .git entry.
func gitWorkTree(dir string) string {
	abs, err := filepath.Abs(dir)
	if err != nil {
		return ""
	}
	for d := abs; ; {
		if _, err := os.Lstat(filepath.Join(d, ".git")); err == nil {
			return d
		}
		up := filepath.Dir(d)
		if up == d {
			return ""
		}
		d = up
	}
}

// gitIgnored says whether git ignores dir in the work tree root (false
// when git cannot tell: no git binary, a broken repository).
func gitIgnored(root, dir string) bool {
	abs, err := filepath.Abs(dir)
	if err != nil {
		return false
	}
	// a file inside: "certs/" in .gitignore matches the directory only
	probe := filepath.Join(abs, pki.CAKeyFile)
	return exec.Command("git", "-C", root, "check-ignore", "-q", "--no-index", probe).Run() == nil
}

func runCertsIssue(args []string, stdout, stderr io.Writer) int {
	fs := newFlags("certs issue", "--dir DIR --role ROLE [flags]", stderr)
	dir := fs.String("dir", "", "the CA's directory (ca.pem, ca-key.pem from mdag certs init; required)")
	role := fs.String("role", "", "coordinator, worker or source (required)")
	name := fs.String("name", "", "the certificate's name, in mdag://ROLE/NAME and the logs (default: the role)")
	hosts := fs.String("hosts", "", "with --role coordinator: its DNS names and IPs, comma-separated (default "+pki.DefaultHosts+")")
	out := fs.String("out", "", "directory to write ROLE.pem, ROLE-key.pem and a copy of ca.pem to (default: --dir); one per machine")
	valid := fs.Duration("valid", pki.DefaultCertValid, "how long the certificate is valid (at most the CA's end)")
	force := fs.Bool("force", false, "replace existing files (rotation: running peers use them for new connections)")
	if code, ok := parseFlags(fs, args); !ok {
		return code
	}
	if *dir == "" || *role == "" {
		fmt.Fprintln(stderr, "mdag certs issue: --dir and --role are required")
		return exitInvalid
	}
	r, err := pki.ParseRole(*role)
	if err != nil {
		fmt.Fprintf(stderr, "mdag certs issue: --role: %v\n", err)
		return exitInvalid
	}
	if *valid <= 0 {
		fmt.Fprintf(stderr, "mdag certs issue: --valid %v: want > 0\n", *valid)
		return exitInvalid
	}
	wrote, err := pki.IssueFiles(*dir, pki.IssueOptions{Role: r, Name: *name, Hosts: *hosts, Out: *out, Now: time.Now(), Valid: *valid, Force: *force})
	if err != nil {
		fmt.Fprintf(stderr, "mdag certs issue: %v\n", err)
		return exitInvalid
	}
	for _, f := range wrote {
		fmt.Fprintln(stdout, "wrote", f)
	}
	return exitOK
}
