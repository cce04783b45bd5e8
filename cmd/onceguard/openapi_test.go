package main

import (
	"bufio"
	"net/http"
	"os"
	"regexp"
	"slices"
	"strings"
	"testing"
)

// docs/openapi.yaml describes the service's routes: every path and
// method it names is served (neither 404 nor 405), every other method of
// those paths is 405, and every route docs/api.md names is in it.
func TestOpenAPIRoutes(t *testing.T) {
	doc := openAPIRoutes(t, "../../docs/openapi.yaml")
	contract := contractRoutes(t, "../../docs/api.md")
	for route := range contract {
		if !doc[route] {
			t.Errorf("docs/api.md names %s; docs/openapi.yaml does not", route)
		}
	}

	base := startServe(t, "--psp-notify-secret", "whsec_test") // the callback route is on
	paths := map[string][]string{}
	for route := range doc {
		method, path, _ := strings.Cut(route, " ")
		paths[path] = append(paths[path], method)
	}
	for path, methods := range paths {
		for _, method := range []string{"GET", "POST", "PUT", "PATCH", "DELETE"} {
			req, err := http.NewRequest(method, base+strings.ReplaceAll(path, "{id}", "1"), strings.NewReader("{}"))
			if err != nil {
				t.Fatal(err)
			}
			req.Header.Set("Content-Type", "application/json")
			resp, err := http.DefaultClient.Do(req)
			if err != nil {
				t.Fatal(err)
			}
			resp.Body.Close()
			documented := slices.Contains(methods, method)
			switch {
			case documented && (resp.StatusCode == http.StatusNotFound || resp.StatusCode == http.StatusMethodNotAllowed):
				t.Errorf("%s %s (in docs/openapi.yaml) = %d; want a route that exists", method, path, resp.StatusCode)
			case !documented && resp.StatusCode != http.StatusMethodNotAllowed:
				t.Errorf("%s %s (not in docs/openapi.yaml) = %d; want 405, or the method documented", method, path, resp.StatusCode)
			}
		}
	}
}

// Every $ref of docs/openapi.yaml names a component the document defines.
func TestOpenAPIRefs(t *testing.T) {
	raw, err := os.ReadFile("../../docs/openapi.yaml")
	if err != nil {
		t.Fatal(err)
	}
	sectionRE := regexp.MustCompile(`^  ([A-Za-z]+):\s*$`)
	nameRE := regexp.MustCompile(`^    ([A-Za-z0-9_.-]+):`)
	defined := map[string]bool{} // "#/components/schemas/Order"
	in, section := false, ""
	for line := range strings.SplitSeq(string(raw), "\n") {
		if line != "" && line[0] != ' ' {
			in = line == "components:"
			continue
		}
		if !in {
			continue
		}
		if m := sectionRE.FindStringSubmatch(line); m != nil {
			section = m[1]
		} else if m := nameRE.FindStringSubmatch(line); m != nil && section != "" {
			defined["#/components/"+section+"/"+m[1]] = true
		}
	}
	refs := regexp.MustCompile(`\$ref: *"([^"]+)"`).FindAllStringSubmatch(string(raw), -1)
	if len(refs) == 0 {
		t.Fatal("docs/openapi.yaml has no $ref")
	}
	for _, m := range refs {
		if !defined[m[1]] {
			t.Errorf("docs/openapi.yaml refers to %s, which it does not define", m[1])
		}
	}
}

// openAPIRoutes reads "METHOD /path" from the paths: block of an OpenAPI
// document written with two-space indents: a path at indent 2, its
// methods at indent 4. It needs no YAML parser.
func openAPIRoutes(t *testing.T, name string) map[string]bool {
	t.Helper()
	f, err := os.Open(name)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	pathRE := regexp.MustCompile(`^  (/\S*):\s*$`)
	methodRE := regexp.MustCompile(`^    (get|put|post|delete|options|head|patch|trace):\s*$`)
	routes := map[string]bool{}
	in, path := false, ""
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		line := sc.Text()
		if line != "" && line[0] != ' ' && line[0] != '#' {
			in = line == "paths:"
			continue
		}
		if !in {
			continue
		}
		if m := pathRE.FindStringSubmatch(line); m != nil {
			path = m[1]
		} else if m := methodRE.FindStringSubmatch(line); m != nil && path != "" {
			routes[strings.ToUpper(m[1])+" "+path] = true
		}
	}
	if err := sc.Err(); err != nil {
		t.Fatal(err)
	}
	if len(routes) == 0 {
		t.Fatalf("%s: no paths and methods under paths:", name)
	}
	return routes
}

// contractRoutes is every "`METHOD /path`" docs/api.md names.
func contractRoutes(t *testing.T, name string) map[string]bool {
	t.Helper()
	raw, err := os.ReadFile(name)
	if err != nil {
		t.Fatal(err)
	}
	routes := map[string]bool{}
	for _, m := range regexp.MustCompile("`(GET|POST|PUT|PATCH|DELETE) (/[^`\\s]*)`").FindAllStringSubmatch(string(raw), -1) {
		routes[m[1]+" "+m[2]] = true
	}
	if len(routes) == 0 {
		t.Fatalf("%s names no routes", name)
	}
	return routes
}
