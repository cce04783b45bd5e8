package main

import (
	"go/ast"
	"go/parser"
	"go/token"
	"net/http"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"sort"
	"strconv"
	"strings"
	"testing"
)

// codeSources are the directories whose Go source holds the error codes
// the service answers: the HTTP layer, the domain, and the idempotency
// middleware. A directory that does not exist is skipped.
var codeSources = []string{
	"../../internal/httpapi",
	"../../internal/app",
	"internal/httpapi",
	"internal/app",
	"../../idempotency",
}

// docs/api.md lists every error code the service answers, with its
// status, and no code the service does not answer.
func TestAPIDocCodes(t *testing.T) {
	service := serviceCodes(t)
	if len(service) == 0 {
		t.Fatalf("no error codes found in %v", codeSources)
	}
	doc := docCodes(t, "../../docs/api.md")
	for code, statuses := range service {
		d, ok := doc[code]
		if !ok {
			t.Errorf("code %s (status %v) is not in docs/api.md's error code table", code, statuses)
			continue
		}
		if len(statuses) > 0 && !slices.Equal(d, statuses) {
			t.Errorf("code %s: docs/api.md says status %v; the service answers %v", code, d, statuses)
		}
	}
	for code := range doc {
		if _, ok := service[code]; !ok {
			t.Errorf("docs/api.md lists code %s, which the service does not answer", code)
		}
	}
}

// docCodes reads the table under "## Error codes": code -> statuses.
func docCodes(t *testing.T, path string) map[string][]int {
	t.Helper()
	raw, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	_, section, ok := strings.Cut(string(raw), "\n## Error codes\n")
	if !ok {
		t.Fatalf("%s has no section ## Error codes", path)
	}
	section, _, _ = strings.Cut(section, "\n## ")
	codes := map[string][]int{}
	row := regexp.MustCompile("^\\| `([a-z_]+)` \\| ([0-9, ]+) \\|")
	for line := range strings.SplitSeq(section, "\n") {
		m := row.FindStringSubmatch(line)
		if m == nil {
			continue
		}
		if _, dup := codes[m[1]]; dup {
			t.Errorf("%s lists code %s twice", path, m[1])
		}
		var statuses []int
		for f := range strings.SplitSeq(m[2], ",") {
			n, err := strconv.Atoi(strings.TrimSpace(f))
			if err != nil {
				t.Fatalf("%s: code %s: status %q", path, m[1], m[2])
			}
			statuses = append(statuses, n)
		}
		sort.Ints(statuses)
		codes[m[1]] = statuses
	}
	if len(codes) == 0 {
		t.Fatalf("%s: no rows | `code` | status | under ## Error codes", path)
	}
	return codes
}

// serviceCodes collects the error codes in codeSources' non-test Go files,
// with the statuses they are answered with where the source says:
//   - constants whose name starts with "code" or "Code";
//   - the Code field of composite literals (a Status field beside it gives
//     the status);
//   - map literals from codes to http.Status constants, or to rows whose
//     first element is one (a code->status table);
//   - string arguments passed as a parameter named code to a function
//     declared there (a parameter named status beside it gives the status).
func serviceCodes(t *testing.T) map[string][]int {
	t.Helper()
	fset := token.NewFileSet()
	var files []*ast.File
	for _, dir := range codeSources {
		names, _ := filepath.Glob(filepath.Join(dir, "*.go"))
		for _, name := range names {
			if strings.HasSuffix(name, "_test.go") {
				continue
			}
			f, err := parser.ParseFile(fset, name, nil, 0)
			if err != nil {
				t.Fatal(err)
			}
			files = append(files, f)
		}
	}
	found := map[string]map[int]bool{}
	add := func(code string, status int) {
		if found[code] == nil {
			found[code] = map[int]bool{}
		}
		if status != 0 {
			found[code][status] = true
		}
	}
	consts := map[string]string{}
	type params struct{ code, status int }
	funcs := map[string]params{}
	fixed := map[string]int{} // function -> the status it answers its code with
	for _, f := range files {
		for _, decl := range f.Decls {
			switch d := decl.(type) {
			case *ast.GenDecl:
				for _, spec := range d.Specs {
					vs, ok := spec.(*ast.ValueSpec)
					if !ok || d.Tok != token.CONST {
						continue
					}
					for i, name := range vs.Names {
						if i < len(vs.Values) {
							if s, ok := stringLit(vs.Values[i]); ok {
								consts[name.Name] = s
							}
						}
					}
				}
			case *ast.FuncDecl:
				p, i := params{-1, -1}, 0
				for _, field := range d.Type.Params.List {
					for _, name := range field.Names {
						switch name.Name {
						case "code":
							p.code = i
						case "status":
							p.status = i
						}
						i++
					}
					if len(field.Names) == 0 {
						i++
					}
				}
				if p.code >= 0 {
					funcs[d.Name.Name] = p
					if p.status < 0 && d.Body != nil {
						ast.Inspect(d.Body, func(n ast.Node) bool {
							if cl, ok := n.(*ast.CompositeLit); ok {
								if v, ok := field(cl, "Code").(*ast.Ident); ok && v.Name == "code" {
									fixed[d.Name.Name] = httpStatus(field(cl, "Status"))
								}
							}
							return true
						})
					}
				}
			}
		}
	}
	for name, s := range consts {
		if strings.HasPrefix(strings.ToLower(name), "code") {
			add(s, 0)
		}
	}
	str := func(e ast.Expr) (string, bool) {
		if s, ok := stringLit(e); ok {
			return s, true
		}
		if id, ok := e.(*ast.Ident); ok {
			s, ok := consts[id.Name]
			return s, ok
		}
		return "", false
	}
	for _, f := range files {
		ast.Inspect(f, func(n ast.Node) bool {
			switch n := n.(type) {
			case *ast.CompositeLit:
				if c, ok := str(field(n, "Code")); ok {
					add(c, httpStatus(field(n, "Status")))
				}
				if _, isMap := n.Type.(*ast.MapType); isMap {
					for _, el := range n.Elts {
						if kv, ok := el.(*ast.KeyValueExpr); ok {
							if c, ok := str(kv.Key); ok {
								v := kv.Value
								if cl, ok := v.(*ast.CompositeLit); ok && len(cl.Elts) > 0 {
									v = cl.Elts[0] // a table row: {status, title, ...}
								}
								if st := httpStatus(v); st != 0 {
									add(c, st)
								}
							}
						}
					}
				}
			case *ast.CallExpr:
				id, ok := n.Fun.(*ast.Ident)
				if !ok {
					return true
				}
				p, ok := funcs[id.Name]
				if !ok || p.code >= len(n.Args) {
					return true
				}
				c, ok := str(n.Args[p.code])
				if !ok {
					return true
				}
				st := fixed[id.Name]
				if p.status >= 0 && p.status < len(n.Args) {
					st = httpStatus(n.Args[p.status])
				}
				add(c, st)
			}
			return true
		})
	}
	out := map[string][]int{}
	for code, set := range found {
		var s []int
		for st := range set {
			s = append(s, st)
		}
		sort.Ints(s)
		out[code] = s
	}
	return out
}

// field is the value of the keyed element name of cl, or nil.
func field(cl *ast.CompositeLit, name string) ast.Expr {
	for _, el := range cl.Elts {
		if kv, ok := el.(*ast.KeyValueExpr); ok {
			if id, ok := kv.Key.(*ast.Ident); ok && id.Name == name {
				return kv.Value
			}
		}
	}
	return nil
}

func stringLit(e ast.Expr) (string, bool) {
	lit, ok := e.(*ast.BasicLit)
	if !ok || lit.Kind != token.STRING {
		return "", false
	}
	s, err := strconv.Unquote(lit.Value)
	return s, err == nil
}

// httpStatus is the value of http.StatusX or an integer literal, else 0.
func httpStatus(e ast.Expr) int {
	switch e := e.(type) {
	case *ast.BasicLit:
		n, _ := strconv.Atoi(e.Value)
		return n
	case *ast.SelectorExpr:
		if x, ok := e.X.(*ast.Ident); !ok || x.Name != "http" {
			return 0
		}
		for st := 100; st < 600; st++ {
			if text := http.StatusText(st); text != "" && "Status"+strings.NewReplacer(" ", "", "-", "", "'", "").Replace(text) == e.Sel.Name {
				return st
			}
		}
	}
	return 0
}
