package main

import (
	"errors"
	"flag"
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
	return runGroup("certs", certsUsage, []subcmd{
		{"init", "--dir DIR [flags]", func() subcommand { return new(certsInitCmd) }},
		{"issue", "--dir DIR --role ROLE [flags]", func() subcommand { return new(certsIssueCmd) }},
	}, args, stdout, stderr)
}

func certsUsage(w io.Writer) {
	fmt.Fprintln(w, "Usage: mdag certs init --dir DIR [--hosts NAMES] [--valid D] [--force]")
	fmt.Fprintln(w, "       mdag certs issue --dir DIR --role coordinator|worker|source [--name NAME] [--hosts NAMES] [--out DIR] [--valid D] [--force]")
	fmt.Fprintln(w, "\ninit creates a CA (ca.pem, ca-key.pem) and one certificate per role (coordinator.pem, worker.pem, source.pem,")
	fmt.Fprintln(w, "each with ROLE-key.pem) in DIR; issue signs another with DIR's CA. Keys are written 0600. Run 'mdag certs init -h'.")
}

// certsInitCmd is mdag certs init's options.
type certsInitCmd struct {
	dir, hosts string
	valid      time.Duration
	force      bool
}

func (c *certsInitCmd) flags(fs *flag.FlagSet) {
	fs.StringVar(&c.dir, "dir", "", "directory to create the CA and certificates in (required; created 0700)")
	fs.StringVar(&c.hosts, "hosts", pki.DefaultHosts, "the coordinator certificate's DNS names and IPs, comma-separated: every name workers and sources dial it by")
	fs.DurationVar(&c.valid, "valid", pki.DefaultCertValid, "how long the certificates are valid (the CA: 10 years)")
	fs.BoolVar(&c.force, "force", false, "replace existing files: a new CA, so every certificate the old one issued (mdag certs issue's too) stops being trusted "+
		"and every peer needs new files (to replace one certificate, keep the CA: mdag certs issue --force)")
}

func (c *certsInitCmd) validate(*flag.FlagSet) []error {
	var errs []error
	if c.dir == "" {
		errs = append(errs, errors.New("--dir is required"))
	}
	if c.valid <= 0 {
		errs = append(errs, fmt.Errorf("--valid %v: want > 0", c.valid))
	}
	return errs
}

func (c *certsInitCmd) run(env *cmdEnv) error {
	if exist := existingCAFiles(c.dir); len(exist) > 0 && !c.force {
		return invalidf("refusing to overwrite %s: %s has a CA already.\n"+
			"  --force makes a new CA: every certificate the old one issued (these and every --out directory of mdag certs issue) stops being trusted,\n"+
			"  and the coordinator, every worker and every source need the new files before they can connect again.\n"+
			"  To replace one certificate and keep the CA: mdag certs issue --dir %s --role coordinator|worker|source [--name NAME] [--out DIR] --force",
			strings.Join(exist, ", "), c.dir, c.dir)
	}
	if root := gitWorkTree(c.dir); root != "" && !gitIgnored(root, c.dir) {
		fmt.Fprintf(env.stderr, "mdag certs init: warning: %s is inside the git work tree %s and not ignored by it: %s signs every certificate; "+
			"keep it out of commits (add %s/ to .gitignore) or use a directory outside the repository\n",
			c.dir, root, filepath.Join(c.dir, pki.CAKeyFile), filepath.Clean(c.dir))
	}
	wrote, err := pki.Init(c.dir, pki.InitOptions{Hosts: c.hosts, Now: time.Now(), Valid: c.valid, Force: c.force})
	if err != nil {
		return invalid(err)
	}
	for _, f := range wrote {
		fmt.Fprintln(env.stdout, "wrote", f)
	}
	fmt.Fprintf(env.stdout, "the coordinator's certificate names %s; run coordinator, workers and sources with --tls-dir %s\n", c.hosts, c.dir)
	fmt.Fprintf(env.stdout, "keep %s/ca-key.pem off the servers: only mdag certs issue needs it\n", c.dir)
	return nil
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

// certsIssueCmd is mdag certs issue's options.
type certsIssueCmd struct {
	dir, role, name, hosts, out string
	valid                       time.Duration
	force                       bool
	r                           pki.Role // --role, parsed
}

func (c *certsIssueCmd) flags(fs *flag.FlagSet) {
	fs.StringVar(&c.dir, "dir", "", "the CA's directory (ca.pem, ca-key.pem from mdag certs init; required)")
	fs.StringVar(&c.role, "role", "", "coordinator, worker or source (required)")
	fs.StringVar(&c.name, "name", "", "the certificate's name, in mdag://ROLE/NAME and the logs (default: the role)")
	fs.StringVar(&c.hosts, "hosts", "", "with --role coordinator: its DNS names and IPs, comma-separated (default "+pki.DefaultHosts+")")
	fs.StringVar(&c.out, "out", "", "directory to write ROLE.pem, ROLE-key.pem and a copy of ca.pem to (default: --dir); one per machine")
	fs.DurationVar(&c.valid, "valid", pki.DefaultCertValid, "how long the certificate is valid (at most the CA's end)")
	fs.BoolVar(&c.force, "force", false, "replace existing files (rotation: running peers use them for new connections)")
}

func (c *certsIssueCmd) validate(*flag.FlagSet) []error {
	var errs []error
	if c.dir == "" {
		errs = append(errs, errors.New("--dir is required"))
	}
	if c.role == "" {
		errs = append(errs, errors.New("--role is required"))
	} else if r, err := pki.ParseRole(c.role); err != nil {
		errs = append(errs, fmt.Errorf("--role: %w", err))
	} else {
		c.r = r
	}
	if c.valid <= 0 {
		errs = append(errs, fmt.Errorf("--valid %v: want > 0", c.valid))
	}
	return errs
}

func (c *certsIssueCmd) run(env *cmdEnv) error {
	wrote, err := pki.IssueFiles(c.dir, pki.IssueOptions{Role: c.r, Name: c.name, Hosts: c.hosts, Out: c.out, Now: time.Now(), Valid: c.valid, Force: c.force})
	if err != nil {
		return invalid(err)
	}
	for _, f := range wrote {
		fmt.Fprintln(env.stdout, "wrote", f)
	}
	return nil
}
