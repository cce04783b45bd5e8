package storm

import (
	"fmt"
	"io"
	"strconv"
	"strings"
	"time"

	"github.com/onceguard/onceguard/cmd/onceguard/internal/money"
)

// stormReport is the storm's result, printed as a table or as JSON.
type stormReport struct {
	Target             string          `json:"target"`
	User               string          `json:"user"`
	N                  int             `json:"n"`
	Amount             money.Amount    `json:"amount"`
	Deposit            money.Amount    `json:"deposit"`
	Scenarios          []*stormOutcome `json:"scenarios"`
	BalanceStart       money.Amount    `json:"balance_start"`
	BalanceEnd         money.Amount    `json:"balance_end"`
	ExpectedBalanceEnd money.Amount    `json:"expected_balance_end"`
	LedgerSum          money.Amount    `json:"ledger_sum"`
	LedgerEntries      int             `json:"ledger_entries"`
	Checks             []stormVerdict  `json:"checks"` // over the whole storm
	Pass               bool            `json:"pass"`
	DurationMS         int64           `json:"duration_ms"`
}

// stormOutcome is one scenario's line of the table.
type stormOutcome struct {
	Name               string         `json:"name"` // "a", "b", "c"
	Title              string         `json:"title"`
	Sent               int            `json:"sent"`
	Answers            []stormCount   `json:"answers"` // by status; a first answer before its replays; then most frequent first
	MoneyMoved         money.Amount   `json:"money_moved"`
	ExpectedMoneyMoved money.Amount   `json:"expected_money_moved"`
	Checks             []stormVerdict `json:"checks"`
	Pass               bool           `json:"pass"`
	DurationMS         int64          `json:"duration_ms"`
}

// stormCount is how many answers of a scenario had one status and code.
type stormCount struct {
	Status   int    `json:"status"` // 0: no HTTP answer (a transport error)
	Code     string `json:"code"`   // the problem's code; "" for a success
	Replayed bool   `json:"replayed"`
	Count    int    `json:"count"`
}

// stormVerdict is one "exactly once" check of a scenario.
type stormVerdict struct {
	Check string `json:"check"`
	Pass  bool   `json:"pass"`
	Got   string `json:"got"`
	Want  string `json:"want"`
}

func (o *stormOutcome) check(name string, got, want any) {
	o.Checks = stormCheck(o.Checks, name, got, want)
}

func (r *stormReport) check(name string, got, want any) {
	r.Checks = stormCheck(r.Checks, name, got, want)
}

func stormCheck(checks []stormVerdict, name string, got, want any) []stormVerdict {
	g, w := fmt.Sprint(got), fmt.Sprint(want)
	return append(checks, stormVerdict{Check: name, Pass: g == w, Got: g, Want: w})
}

// stormAnswer is one HTTP answer as the storm sees it.
type stormAnswer struct {
	status     int
	code       string
	replayed   bool
	retryAfter string
	body       map[string]any
	err        error // no answer at all
}

func (a stormAnswer) String() string {
	if a.err != nil {
		return a.err.Error()
	}
	if a.code != "" {
		return fmt.Sprintf("%d %s", a.status, a.code)
	}
	return strconv.Itoa(a.status)
}

func (a stormAnswer) str(field string) string { s, _ := a.body[field].(string); return s }

// writeTable prints the report for people.
func (r *stormReport) writeTable(w io.Writer) {
	fmt.Fprintf(w, "onceguard storm against %s\n", r.Target)
	fmt.Fprintf(w, "user %s, deposit %s (enough to pay every request), %d concurrent requests per scenario\n\n", r.User, r.Deposit, r.N)
	rows := [][]string{{"SCENARIO", "SENT", "ANSWER", "COUNT", "MOVED", "EXPECTED", "RESULT"}}
	for _, o := range r.Scenarios {
		verdict := "PASS"
		if !o.Pass {
			verdict = "FAIL"
		}
		for i, c := range o.Answers {
			answer := strconv.Itoa(c.Status)
			if c.Status == 0 {
				answer = "-"
			}
			if c.Code != "" {
				answer += " " + c.Code
			}
			if c.Replayed {
				answer += " (replayed)"
			}
			row := []string{"", "", answer, strconv.Itoa(c.Count), "", "", ""}
			if i == 0 {
				row[0], row[1], row[4], row[5], row[6] = "("+o.Name+") "+o.Title, strconv.Itoa(o.Sent), o.MoneyMoved.String(), o.ExpectedMoneyMoved.String(), verdict
			}
			rows = append(rows, row)
		}
	}
	stormColumns(w, rows, []bool{false, true, false, true, true, true, false})
	fmt.Fprintln(w)
	ledger := "sum"
	if r.LedgerSum != r.BalanceEnd {
		ledger = "do NOT sum"
	}
	fmt.Fprintf(w, "balance %s -> %s (expected %s); the ledger's %d entries %s to %s\n",
		r.BalanceStart, r.BalanceEnd, r.ExpectedBalanceEnd, r.LedgerEntries, ledger, r.LedgerSum)
	for _, o := range r.Scenarios {
		for _, v := range o.Checks {
			if !v.Pass {
				fmt.Fprintf(w, "FAIL (%s) %s: got %s; want %s\n", o.Name, v.Check, v.Got, v.Want)
			}
		}
	}
	for _, v := range r.Checks {
		if !v.Pass {
			fmt.Fprintf(w, "FAIL %s: got %s; want %s\n", v.Check, v.Got, v.Want)
		}
	}
	sent := 0
	for _, o := range r.Scenarios {
		sent += o.Sent
	}
	took := (time.Duration(r.DurationMS) * time.Millisecond).Round(10 * time.Millisecond)
	if r.Pass {
		fmt.Fprintf(w, "PASS: every scenario moved money exactly once (%d storm requests, %v)\n", sent, took)
	} else {
		fmt.Fprintf(w, "FAIL: money did not move exactly once (%d storm requests, %v)\n", sent, took)
	}
}

// stormColumns prints rows as columns two spaces apart; right[i] aligns
// column i to the right.
func stormColumns(w io.Writer, rows [][]string, right []bool) {
	width := make([]int, len(right))
	for _, r := range rows {
		for i, cell := range r {
			width[i] = max(width[i], len(cell))
		}
	}
	for _, r := range rows {
		var b strings.Builder
		for i, cell := range r {
			pad := strings.Repeat(" ", width[i]-len(cell))
			if i > 0 {
				b.WriteString("  ")
			}
			if right[i] {
				b.WriteString(pad + cell)
			} else {
				b.WriteString(cell + pad)
			}
		}
		fmt.Fprintln(w, strings.TrimRight(b.String(), " "))
	}
}
