package conformance

import (
	"encoding/xml"
	"fmt"
	"io"
	"strings"
)

// WriteText writes one line per scenario for a person: the outcome, the
// name, why it failed (or the claim it passed), and the docs' section.
func WriteText(w io.Writer, rep Report) error {
	width := 0
	for _, res := range rep.Results {
		width = max(width, len(res.Name))
	}
	var b strings.Builder
	for _, res := range rep.Results {
		text := res.Rationale
		switch res.Outcome {
		case Fail, Skip:
			text = res.Why
		default:
			if res.Why != "" {
				text += " (" + res.Why + ")"
			}
		}
		fmt.Fprintf(&b, "%-4s  %-*s  %s  [%s]\n", strings.ToUpper(res.Outcome), width, res.Name, text, res.Doc)
	}
	fmt.Fprintf(&b, "%d passed, %d failed, %d skipped: %s\n", rep.Passed, rep.Failed, rep.Skipped, rep.APIURL)
	if names := rep.FailedNames(); len(names) > 0 {
		fmt.Fprintf(&b, "first failure: %s (docs/conformance.md says what each scenario checks)\n", names[0])
	}
	_, err := io.WriteString(w, b.String())
	return err
}

// junitSuite is JUnit XML's testsuite, as CI systems read it.
type junitSuite struct {
	XMLName  xml.Name    `xml:"testsuite"`
	Name     string      `xml:"name,attr"`
	Tests    int         `xml:"tests,attr"`
	Failures int         `xml:"failures,attr"`
	Skipped  int         `xml:"skipped,attr"`
	Time     string      `xml:"time,attr"`
	Cases    []junitCase `xml:"testcase"`
}

type junitCase struct {
	Name      string        `xml:"name,attr"`
	Classname string        `xml:"classname,attr"`
	Time      string        `xml:"time,attr"`
	Failure   *junitMessage `xml:"failure,omitempty"`
	Skipped   *junitMessage `xml:"skipped,omitempty"`
	SystemOut string        `xml:"system-out,omitempty"`
}

type junitMessage struct {
	Message string `xml:"message,attr"`
	Text    string `xml:",chardata"`
}

// WriteJUnit writes the report as one JUnit testsuite, a testcase per
// scenario.
func WriteJUnit(w io.Writer, rep Report) error {
	s := junitSuite{Name: "idemctl conformance", Tests: len(rep.Results), Failures: rep.Failed, Skipped: rep.Skipped}
	var total float64
	for _, res := range rep.Results {
		sec := res.Took.Seconds()
		total += sec
		c := junitCase{Name: res.Name, Classname: "idemctl.conformance", Time: fmt.Sprintf("%.3f", sec),
			SystemOut: res.Rationale + "\n" + res.Doc}
		switch res.Outcome {
		case Fail:
			c.Failure = &junitMessage{Message: res.Why, Text: res.Why + "\n" + res.Doc}
		case Skip:
			c.Skipped = &junitMessage{Message: res.Why}
		}
		s.Cases = append(s.Cases, c)
	}
	s.Time = fmt.Sprintf("%.3f", total)
	if _, err := io.WriteString(w, xml.Header); err != nil {
		return err
	}
	enc := xml.NewEncoder(w)
	enc.Indent("", "  ")
	if err := enc.Encode(s); err != nil {
		return fmt.Errorf("write junit: %w", err)
	}
	_, err := io.WriteString(w, "\n")
	return err
}
