"""`eagle-zoo openers`: request openers for `eagle-zoo train prompts --openers-file`,
spread over request kinds and subjects.

Left to itself a small chat model writes mostly advice and planning requests; a handful
of openers ("Explain", "Write a") steer the kind of request but not its subject, so the
answers circle a few topics and the draft vocabulary misses topic words. These openers
pair request kinds (explain, compare, write a story about, extract from, ...) with
subjects from every field a general chat model is asked about, plus role play and
subject-free starters (code, math, reasoning, extraction); the target completes each
request in its own words before answering it. Every `--free-every`-th line is `*` (a
free row: the target's own request). The output is deterministic for a seed. The lists
are written for this tool and hold no benchmark text.
"""
from __future__ import annotations

import argparse
import random
import sys

# Subjects by field, as noun phrases that read after "about", "of", "explain".
TOPICS = {
    "physics": "gravity, black holes, the theory of relativity, quantum entanglement, nuclear fusion, electromagnetism, "
               "friction, the speed of light, thermodynamics, magnetism, sound waves, superconductors, the Doppler effect, "
               "dark matter, the Big Bang, semiconductors, lasers, radioactivity, kinetic energy, buoyancy",
    "chemistry": "chemical bonds, acids and bases, the periodic table, catalysts, oxidation, polymers, electrolysis, "
                 "carbon dating, the pH scale, combustion, crystals, isotopes, organic chemistry, rust, batteries",
    "biology": "photosynthesis, DNA replication, the immune system, evolution by natural selection, cell division, "
               "the human heart, vaccines, antibiotics, gut bacteria, the nervous system, enzymes, genetic mutations, "
               "coral reefs, bird migration, sleep, the circulatory system, stem cells, viruses, hormones, mitochondria, "
               "CRISPR gene editing, pollination, the food chain, the human brain, muscle growth",
    "earth": "plate tectonics, volcanoes, earthquakes, hurricanes, the water cycle, glaciers, ocean currents, the ozone "
             "layer, deserts, rainforests, soil erosion, the carbon cycle, tsunamis, climate change, the seasons",
    "space": "the solar system, Mars exploration, exoplanets, the Moon landing, satellites, comets, neutron stars, "
             "the International Space Station, solar eclipses, the life cycle of stars, telescopes, space tourism",
    "math": "prime numbers, probability, calculus, the Pythagorean theorem, statistics, linear algebra, fractals, "
            "game theory, infinity, logarithms, geometry, compound interest, the Fibonacci sequence, graph theory, "
            "Bayes' theorem, matrices, exponential growth, cryptography",
    "computing": "machine learning, neural networks, the internet, cloud computing, blockchain, cybersecurity, "
                 "operating systems, databases, recursion, sorting algorithms, open-source software, quantum computers, "
                 "compilers, encryption, large language models, computer viruses, version control, web browsers, "
                 "data structures, virtual reality, robotics, self-driving cars, the history of the computer",
    "medicine": "diabetes, high blood pressure, mental health, nutrition, exercise, the common cold, allergies, "
                "anesthesia, cancer treatment, public health, meditation, vitamins, heart disease, dementia, "
                "the placebo effect, telemedicine, antibiotic resistance, first aid",
    "history": "the Roman Empire, ancient Egypt, the French Revolution, the Industrial Revolution, World War I, "
               "World War II, the Cold War, the Renaissance, the Silk Road, the printing press, the American Civil War, "
               "the fall of the Berlin Wall, the Ming dynasty, the Aztec empire, the Black Death, the Age of Exploration, "
               "the Ottoman Empire, ancient Greece, the civil rights movement, the Meiji Restoration, the Vikings, "
               "colonialism in Africa, the Great Depression, the space race, the invention of writing",
    "geography": "the Amazon river, the Sahara desert, the Himalayas, the Mediterranean Sea, Japan, Brazil, Canada, "
                 "India, Iceland, Kenya, Australia, New Zealand, the Alps, the Arctic, Egypt, Mexico City, Istanbul, "
                 "Paris, Tokyo, New York City, the Great Barrier Reef, the Nile, Scandinavia, Southeast Asia",
    "economics": "inflation, supply and demand, interest rates, the stock market, globalization, unemployment, "
                 "cryptocurrencies, taxes, free trade, monopolies, recessions, central banks, the gig economy, "
                 "minimum wage, universal basic income, opportunity cost, microfinance, economic inequality",
    "business": "marketing strategy, startups, remote work, leadership, customer service, branding, e-commerce, "
                "negotiation, project management, small businesses, social media marketing, supply chains, "
                "corporate social responsibility, job interviews, team building, business ethics, pricing",
    "society": "democracy, human rights, social media, urbanization, immigration, education reform, privacy, "
               "fake news, gender equality, aging populations, volunteering, censorship, public transportation, "
               "homelessness, online learning, the four-day work week, voting, freedom of speech",
    "philosophy": "free will, utilitarianism, stoicism, the meaning of life, ethics of artificial intelligence, "
                  "existentialism, the trolley problem, Plato's cave, moral relativism, consciousness, justice, "
                  "happiness, Confucianism, the scientific method, skepticism",
    "arts": "impressionism, the Mona Lisa, jazz, classical music, hip hop, modern architecture, photography, "
            "Shakespeare's plays, science fiction, poetry, film noir, opera, street art, ballet, Greek mythology, "
            "the novel 1984, video games as art, animation, folk tales, the Harry Potter books, Beethoven, "
            "Frida Kahlo, Gothic cathedrals, Japanese haiku, the history of cinema",
    "environment": "renewable energy, solar power, wind farms, recycling, deforestation, plastic pollution, electric "
                   "cars, endangered species, sustainable farming, water scarcity, air pollution, nuclear power, "
                   "biodiversity, carbon taxes, composting, fast fashion, national parks",
    "everyday": "cooking pasta, gardening, learning a new language, saving money, time management, public speaking, "
                "moving to a new city, adopting a dog, planning a wedding, running a marathon, baking bread, "
                "home workouts, travelling on a budget, coffee, chess, camping, writing a resume, parenting, "
                "minimalism, friendship, photography for beginners, healthy sleep habits, tea ceremonies",
    "sports": "the Olympic Games, football tactics, basketball, tennis, the history of the World Cup, yoga, "
              "cycling, swimming technique, esports, cricket, mountain climbing, martial arts, chess strategy",
    "engineering": "bridges, the internal combustion engine, electric circuits, 3D printing, skyscrapers, dams, "
                   "jet engines, the power grid, microchips, water treatment, GPS, wind turbines, refrigerators",
    "science in depth": "electron orbitals, the Earth's magnetic poles, calcium in the human body, noble gases, "
                        "the greenhouse effect, photosynthesis and respiration, the speed of sound, tides, "
                        "the structure of the atom, chemical reactions in cooking, blood types, the ear and hearing, "
                        "the human eye, the laws of motion, ocean acidification, antimatter, the states of matter",
    "psychology": "memory, motivation, cognitive biases, habits, emotional intelligence, procrastination, "
                  "child development, stress, the psychology of persuasion, introversion, dreams, decision making",
    "law and government": "the separation of powers, copyright law, the jury system, the United Nations, "
                          "international law, constitutions, the European Union, contracts, intellectual property",
    "food": "fermentation, the Mediterranean diet, chocolate, spices, vegetarian cooking, the history of pizza, "
            "food preservation, sourdough, street food in Asia, wine making, sugar",
    "language": "the English language, grammar, idioms, the history of the alphabet, sign language, bilingualism, "
                "etymology, Latin, dialects, translation, punctuation, metaphors, rhetoric",
}

# Requests about a subject ({t}); the target completes the request after the opener.
TOPIC_FRAMES = [
    "Explain {t}", "Explain {t} to a ten-year-old", "Explain {t} in simple terms,", "Can you explain how {t}",
    "What is {t}", "What are the main ideas behind {t}", "What are the advantages and disadvantages of {t}",
    "What are the causes and effects of {t}", "Why is {t} important", "How does {t}", "How did {t}",
    "Describe {t}", "Describe the history of {t}", "Describe the role of {t} in", "Describe how {t}",
    "Compare {t} and", "Compare and contrast {t} with", "Discuss {t}", "Discuss the impact of {t} on",
    "Discuss the ethical questions raised by {t}", "Analyze {t}", "Analyze the influence of {t} on",
    "Summarize what is known about {t}", "Give an overview of {t}", "Outline the key facts about {t}",
    "Write an essay about {t}", "Write a persuasive essay on {t}", "Write a blog post about {t}",
    "Write a short story about {t}", "Write a poem about {t}", "Write a speech about {t}",
    "Write a news article about {t}", "Write a dialogue between two friends about {t}",
    "Write a letter to a newspaper about {t}", "Write a product description inspired by {t}",
    "Compose a short essay on {t}", "Compose a tweet about {t}", "Draft an email to a colleague about {t}",
    "Create a lesson plan about {t}", "Create a quiz with five questions about {t}",
    "Give me five interesting facts about {t}", "List the most common misconceptions about {t}",
    "Provide a step-by-step explanation of {t}", "Provide insights into {t}",
    "In the field of {t},", "As an expert on {t},", "I'm writing a report on {t}.", "I am curious about {t}.",
    "My teacher asked me to research {t}.", "Imagine a world without {t}.", "Evaluate the arguments for and against {t}",
    "What would happen if {t}", "How has {t} changed over time", "What can we learn from {t}",
    "Suggest a title and an outline for a book about {t}", "Tell me a story that involves {t}",
]

# Requirements a request may add after its subject (MT-bench-like requests often carry one);
# only after frames that form a whole request (an imperative verb first, the subject last).
CONSTRAINTS = [
    "Keep it under 200 words.", "Use simple language.", "Include three examples.", "Format the answer as a numbered list.",
    "Give it a catchy title.", "Write it in a formal tone.", "Make it fun to read.", "End with a short summary.",
    "Use a heading for each part.", "Answer in no more than five sentences.", "Write it for a general audience.",
    "Add a short conclusion.", "Make it persuasive.", "Use an analogy.", "Write two paragraphs.",
    "Mention both sides.", "Include a short example from history.", "Explain each step.",
]
IMPERATIVES = {"Explain", "Describe", "Discuss", "Analyze", "Summarize", "Give", "Outline", "Write", "Compose",
               "Draft", "Create", "List", "Provide", "Evaluate", "Suggest", "Tell"}


def takes_constraint(frame: str) -> bool:
    """A frame the subject completes: "Discuss {t}", not "Describe how {t}" (which the
    target must go on with a verb)."""
    words = frame.split()
    return frame.endswith("{t}") and words[0] in IMPERATIVES and words[-2] != "how"


def subjects() -> list[str]:
    """Every subject of TOPICS, field after field."""
    return [t.strip() for field in TOPICS.values() for t in field.split(",") if t.strip()]


# Role play: "{r}" is a character the target is asked to be.
ROLES = ("a pirate captain, a detective in 1920s London, a medieval knight, a chef in a busy restaurant, "
         "a tour guide in Rome, an astronaut on Mars, a personal fitness trainer, a history teacher, a famous "
         "scientist, a travel agent, a job interviewer, a doctor, a wise old wizard, a news reporter, a customer "
         "service agent, a startup founder pitching investors, a poet, a sports commentator, a museum curator, "
         "a robot learning about humans, a park ranger, a lawyer, a movie critic, a marriage counselor, "
         "a time traveler from the year 3000, a librarian, a financial advisor, a kindergarten teacher, "
         "a stand-up comedian, a ship's captain in a storm").split(", ")
ROLE_FRAMES = ["Imagine you are {r}.", "Pretend to be {r}.", "You are {r}.", "Act as {r} and",
               "Role-play as {r}.", "Take on the role of {r}."]

# Request kinds that need no subject: code, math, reasoning, extraction and rewriting
# (the target writes the text to work on inside its request).
STARTERS = [
    "Write a Python function that", "Write a Python program to", "Write a JavaScript function that",
    "Write a C++ program that", "Write a SQL query that", "Write a Java class that", "Implement a",
    "Fix the bug in this code:", "Explain what this code does:", "What is the time complexity of",
    "Write a regular expression that", "Write a shell script that", "Refactor the following function",
    "Solve for x:", "Prove that", "Find the value of", "Calculate", "A store sells", "If a car travels",
    "What is the probability that", "A farmer has", "How many ways can",
    "A ball is thrown upward", "Calculate the energy needed to", "A solution contains", "Balance the chemical equation",
    "Describe the process by which", "What happens when", "Why does", "How would you design an experiment to",
    "Solve this riddle:", "Here is a logic puzzle:", "Which of the following statements is true",
    "If all cats are animals and", "Determine whether the following argument is valid:",
    "Extract the names, dates and places from the following text:",
    "Summarize the following paragraph in two sentences:", "Classify the following reviews as positive or negative:",
    "Identify the main idea of this passage:", "Turn the following information into a table:",
    "Convert the following data into JSON:", "Rewrite this paragraph to make it more formal:",
    "Edit the following text for grammar and clarity:", "Translate the following sentence into French:",
    "Rate the following movie reviews from 1 to 5:", "Find the errors in this sentence:",
    "Given the following list of products and prices,", "Read the email below and",
]


def build(num: int, free_every: int, seed: int, constraint_share: float = 0.0,
          starter_share: float = 0.25) -> list[str]:
    """``num`` openers: every ``free_every``-th one ``*``; of the others 10% role play,
    ``starter_share`` starters (code, math, reasoning, extraction) and the rest subject
    requests, in a seeded order without repeats until the subject x frame pairs run out.
    ``constraint_share`` of the whole subject requests end with a requirement ("Keep it
    under 200 words."); with the default 0 no line carries one."""
    rng = random.Random(seed)
    topics = subjects()
    pairs = [f.format(t=t) for f in TOPIC_FRAMES for t in topics]
    whole = {f.format(t=t) for f in TOPIC_FRAMES if takes_constraint(f) for t in topics}
    extra = random.Random(f"{seed}-constraints")  # its own stream: the share leaves the other lines alone
    roles = [f.format(r=r) for f in ROLE_FRAMES for r in ROLES]
    for pool in (pairs, roles):
        rng.shuffle(pool)
    out, i = [], 0
    while len(out) < num:
        if free_every and len(out) % free_every == free_every - 1:
            out.append("*")
            continue
        u = rng.random()
        if u < 0.9 - starter_share:
            line = pairs[i % len(pairs)]
            i += 1
            if line in whole and constraint_share and extra.random() < constraint_share:
                line = f"{line}. {extra.choice(CONSTRAINTS)}"
            out.append(line)
        elif u < 1.0 - starter_share:
            out.append(rng.choice(roles))
        else:
            out.append(rng.choice(STARTERS))
    return out


def add_arguments(ap: argparse.ArgumentParser) -> None:
    ap.add_argument("--num", type=int, default=60000, help="lines to write (default: %(default)s)")
    ap.add_argument("--free-every", type=int, default=3,
                    help="every N-th line a free row (*); 0: none (default: %(default)s)")
    ap.add_argument("--seed", type=int, default=0, help="the same seed writes the same lines (default: %(default)s)")
    ap.add_argument("--constraint-share", type=float, default=0.0,
                    help="share of the whole subject requests that end with a requirement (0-1)")
    ap.add_argument("--starter-share", type=float, default=0.25,
                    help="share of the non-free lines that are code, math, reasoning and extraction starters "
                         "(0-0.9; role play keeps 0.1, subject requests the rest)")


def run(args: argparse.Namespace) -> int:
    bad = [text for text, wrong in (
        (f"--num {args.num}: must be at least 1", args.num < 1),
        (f"--free-every {args.free_every}: must be 0 (no free rows) or more", args.free_every < 0),
        (f"--constraint-share {args.constraint_share}: must be within 0-1", not 0 <= args.constraint_share <= 1),
        (f"--starter-share {args.starter_share}: must be within 0-0.9", not 0 <= args.starter_share <= 0.9),
    ) if wrong]
    if bad:
        raise SystemExit("eagle-zoo openers: " + "; ".join(bad))
    lines = build(args.num, args.free_every, args.seed, args.constraint_share, args.starter_share)
    sys.stdout.write("".join(line + "\n" for line in lines))
    return 0
