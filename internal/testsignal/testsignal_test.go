package testsignal

import "testing"

func TestUninitialisedSignalDropsValues(t *testing.T) {
	var s Signal[int]
	s.Signal(1) // must neither block nor panic
	if s.ch != nil {
		t.Fatal("Signal initialised itself")
	}
}

func TestSignalDeliversInOrder(t *testing.T) {
	var s Signal[string]
	s.Init()
	s.Signal("a")
	s.Signal("b")
	if a, b := s.WaitOrTimeout(t), s.WaitOrTimeout(t); a != "a" || b != "b" {
		t.Fatalf("got %q, %q", a, b)
	}
}
